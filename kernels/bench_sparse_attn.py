"""Block-sparse attention: dense SDPA, FlexAttention with the layout's BlockMask, and each ds path, one table.

    python3 kernels/bench_sparse_attn.py --device cuda --json bench.json     # GPU: the full table
    python kernels/bench_sparse_attn.py --quick                              # CPU: small sizes only

Full table (issue 30): 4096, 16384 and 65536 tokens, batch 1, 16 heads, head dim 64 and 128, bf16, the fixed,
bigbird and bslongformer layouts at their default parameters, forward and forward+backward, median time and
peak memory above the inputs (CUDA: torch.cuda.max_memory_allocated; CPU: not measured, shown as n/a), each
layout's density and the ideal time (dense time x density). Methods:

* sdpa-dense:      torch.nn.functional.scaled_dot_product_attention (flash on CUDA), the whole matrix
* flex:            torch.compile(flex_attention) with the BlockMask ds builds from the layout, called directly
* ds-auto:         SparseSelfAttention() as users get it (its chosen path is printed in the table)
* ds-numba:        backend='numba' (the flash-style Numba kernels; CUDA only)
* ds-torch:        backend='torch' (CPU: torch's flash kernel over row groups; CUDA: gathered matmuls)

--quick (CPU): 1024 and 2048 tokens, 4 heads, head dim 64, fp32, and no flex backward (torch has none on CPU).
Rows are written to --json as they are measured, so a run stopped by a timeout keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

LAYOUTS = ("fixed", "bigbird", "bslongformer")


def _config(name: str, heads: int):
    from ds_sparse_attn import BigBirdSparsityConfig, BSLongformerSparsityConfig, FixedSparsityConfig

    return {
        "fixed": FixedSparsityConfig,
        "bigbird": BigBirdSparsityConfig,
        "bslongformer": BSLongformerSparsityConfig,
    }[name](num_heads=heads)


def _time(fn, device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _method(name: str, config, seq: int, device: str):
    """(callable(q, k, v), path label) or None when the method does not run here."""
    from ds_sparse_attn import SparseSelfAttention, _flex_attention

    if name == "sdpa-dense":
        return torch.nn.functional.scaled_dot_product_attention, "dense"
    if name == "flex":
        dev = torch.device(device)
        layout = config.make_layout(seq)[:1].to(dev).bool()
        tile = _flex_attention.tile_size(config.block, layout.shape[1], dev)
        mask = _flex_attention.block_mask(layout, config.block, tile)
        options = _flex_attention.kernel_options(tile)
        fn = _flex_attention.compiled()
        return (lambda q, k, v: fn(q, k, v, block_mask=mask, kernel_options=options)), f"tile {tile}"
    if name == "ds-numba" and device != "cuda":
        return None
    backend = {"ds-auto": "auto", "ds-numba": "numba", "ds-torch": "torch"}[name]
    module = SparseSelfAttention(config, max_seq_length=seq, backend=backend).to(device)
    return module, module


def run(args: argparse.Namespace) -> list[dict]:
    device, dtype = args.device, getattr(torch, args.dtype)
    torch._dynamo.config.cache_size_limit = 256  # one compile per (layout, seq, dim) is expected
    rows: list[dict] = []
    for dim in args.dims:
        for seq in args.seqs:
            for layout_name in args.layouts:
                config = _config(layout_name, args.heads)
                density = float(config.make_layout(seq).float().mean())
                for method in args.methods:
                    if method == "ds-numba" and seq > args.numba_max_seq:
                        continue
                    made = _method(method, config, seq, device)
                    if made is None:
                        continue
                    fn, label = made
                    row = {
                        "dim": dim,
                        "seq": seq,
                        "layout": layout_name,
                        "density": density,
                        "method": method,
                    }
                    try:
                        row.update(
                            _measure(
                                fn, seq, dim, dtype, args, no_backward=method == "flex" and device == "cpu"
                            )
                        )
                    except Exception as exc:  # noqa: BLE001 - a failing method is a row saying why
                        row["error"] = (
                            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"
                        )
                    row["path"] = _path(label, device, dtype)
                    rows.append(row)
                    print(f"done: {row}", file=sys.stderr, flush=True)
                    if args.json:
                        with open(args.json, "w") as f:
                            json.dump(rows, f, indent=1)
    return rows


def _path(label, device: str, dtype: torch.dtype) -> str:
    if isinstance(label, str):
        return label
    return label.chosen.get(f"{device} {str(dtype).removeprefix('torch.')}", "?")


def _measure(fn, seq: int, dim: int, dtype: torch.dtype, args: argparse.Namespace, no_backward: bool) -> dict:
    device = args.device
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(1, args.heads, seq, dim, device=device, dtype=dtype, requires_grad=not no_backward)
        for _ in range(3)
    )
    grad = torch.randn_like(q)
    result: dict = {}
    with torch.no_grad():
        fn(q, k, v)  # warm-up: compile, layout plan, kernel JIT
    if not no_backward:
        fn(q, k, v).backward(grad)
    for kind in ("fwd", "fwd_bwd"):
        if kind == "fwd_bwd" and no_backward:
            result[kind + "_ms"] = result[kind + "_peak_mb"] = None
            continue
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()

        def call(kind: str = kind) -> None:
            if kind == "fwd":
                with torch.no_grad():
                    fn(q, k, v)
            else:
                fn(q, k, v).backward(grad)

        result[kind + "_ms"] = _time(call, device, args.repeats) * 1e3
        result[kind + "_peak_mb"] = (
            (torch.cuda.max_memory_allocated() - base) / 2**20 if device == "cuda" else None
        )
    return result


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    print(
        f"\n{args.device}, {args.dtype}, batch 1, {args.heads} heads, default layout parameters, median of {args.repeats}; "
        "ideal = dense SDPA time x density; peak = memory above the inputs (n/a: not measured on CPU)\n"
    )
    print(
        "| dim | seq | layout | density | method (path) | fwd ms | ideal fwd ms | fwd+bwd ms | ideal fwd+bwd ms "
        "| fwd peak MB | fwd+bwd peak MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    dense = {
        (r["dim"], r["seq"], r["layout"]): r for r in rows if r["method"] == "sdpa-dense" and "error" not in r
    }

    def cell(value, fmt: str = "{:.1f}") -> str:
        return "n/a" if value is None else fmt.format(value)

    for r in rows:
        d = dense.get((r["dim"], r["seq"], r["layout"]), {})
        head = (
            f"| {r['dim']} | {r['seq']} | {r['layout']} | {r['density']:.3f} | {r['method']} ({r['path']}) |"
        )
        if "error" in r:
            print(head + f" failed: {r['error']} | | | | | |")
            continue
        ideal = [None if d.get(key) is None else d[key] * r["density"] for key in ("fwd_ms", "fwd_bwd_ms")]
        cells = [r["fwd_ms"], ideal[0], r["fwd_bwd_ms"], ideal[1]]
        peaks = [r["fwd_peak_mb"], r["fwd_bwd_peak_mb"]]
        print(
            head
            + " "
            + " | ".join(cell(c) for c in cells)
            + " | "
            + " | ".join(cell(p, "{:.0f}") for p in peaks)
            + " |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    parser.add_argument(
        "--quick", action="store_true", help="CPU-sized run: 1024/2048 tokens, 4 heads, dim 64, fp32"
    )
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    methods = ["sdpa-dense", "flex", "ds-auto", "ds-numba", "ds-torch"]
    parser.add_argument("--methods", nargs="+", default=methods, choices=methods)
    parser.add_argument("--numba-max-seq", type=int, default=16384, help="skip ds-numba above this length")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the rows here as they are measured")
    parser.add_argument("--table-from", default=None, help="print the table of a --json file and exit")
    args = parser.parse_args()
    if args.table_from:
        with open(args.table_from) as f:
            print_table(json.load(f), args)
        return
    if args.quick:
        args.seqs, args.dims, args.heads, args.dtype, args.repeats = [1024, 2048], [64], 4, "float32", 3
    rows = run(args)
    print_table(rows, args)


if __name__ == "__main__":
    main()
