"""Block-sparse attention (ds-sparse-attn) vs dense SDPA vs compiled FlexAttention, one run, markdown table.

    .venv/bin/python kernels/bench_sparse_attn.py                      # CPU, seq 4096 and 16384
    .venv/bin/python kernels/bench_sparse_attn.py --device cuda        # GPU: Numba kernels vs Flex vs SDPA
    .venv/bin/python kernels/bench_sparse_attn.py --skip-dense-above 8192   # no 16384 dense run
    .venv/bin/python kernels/bench_sparse_attn.py --interleaved --methods ds-sparse-attn flex-compiled  # fair ratios

Methods: ds-sparse-attn (default backend: on CPU torch's fused flash kernel over groups of query rows that
share their key blocks), ds-sparse-attn-gather (backend='torch-gather': the earlier batched matmuls over
gathered blocks), flex-compiled, sdpa-dense.

Every (method, sequence) case runs in a fresh subprocess so that its peak memory (CPU: peak RSS above the
process's RSS after the inputs were created; CUDA: torch.cuda.max_memory_allocated above the inputs) is its
own. Layout: FixedSparsityConfig, local window 4 blocks, 1 global block, block 64, bidirectional.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _peak_mb(device: str, baseline: int) -> float:
    if device == "cuda":
        return (torch.cuda.max_memory_allocated() - baseline) / 2**20
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline) / 1024


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time(fn, device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_case(args: argparse.Namespace) -> dict:
    """One method at one sequence length, in this process."""
    from ds_sparse_attn import FixedSparsityConfig, SparseSelfAttention

    torch.manual_seed(0)
    device, seq = args.device, args.seq
    dtype = getattr(torch, args.dtype)
    config = FixedSparsityConfig(args.heads, args.block, num_local_blocks=4, num_global_blocks=1)
    layout = config.make_layout(seq)
    q, k, v = (
        torch.randn(1, args.heads, seq, args.dim, device=device, dtype=dtype, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn_like(q)
    result = {"method": args.method, "seq": seq, "density": float(layout.float().mean()), "compile_s": None}
    if args.method.startswith("ds-sparse-attn"):
        # ds-sparse-attn-gather: the earlier CPU path (batched matmuls over gathered blocks), for comparison
        backend = "torch-gather" if args.method == "ds-sparse-attn-gather" else "auto"
        module = SparseSelfAttention(config, max_seq_length=seq, backend=backend).to(device)
        attention = lambda q, k, v: module(q, k, v)  # noqa: E731
    elif args.method == "sdpa-dense":
        attention = torch.nn.functional.scaled_dot_product_attention
    else:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        blocks = layout[0].to(device).bool()
        block = args.block

        def mask_mod(b, h, q_idx, kv_idx):
            return blocks[q_idx // block, kv_idx // block]

        block_mask = create_block_mask(mask_mod, None, None, seq, seq, device=device, BLOCK_SIZE=block)
        compiled = torch.compile(flex_attention, dynamic=False)
        attention = lambda q, k, v: compiled(q, k, v, block_mask=block_mask)  # noqa: E731
        start = time.perf_counter()
        if device == "cpu":  # FlexAttention has no CPU backward (torch 2.13), not even inputs needing grad
            q, k, v = (t.detach() for t in (q, k, v))
            with torch.no_grad():
                attention(q, k, v)
        else:
            attention(q, k, v).backward(grad)  # compiles forward and backward
        _sync(device)
        result["compile_s"] = time.perf_counter() - start
        q.grad = k.grad = v.grad = None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = _rss_kb()

    def forward() -> None:
        with torch.no_grad():
            attention(q, k, v)

    def forward_backward() -> None:
        attention(q, k, v).backward(grad)

    forward()  # warm-up (first-call costs: layout plan, kernel JIT)
    result["fwd_s"] = _time(forward, device, args.repeats)
    result["fwd_peak_mb"] = _peak_mb(device, baseline)
    result["fwd_bwd_s"] = result["fwd_bwd_peak_mb"] = None
    if not (args.method == "flex-compiled" and device == "cpu"):
        forward_backward()
        result["fwd_bwd_s"] = _time(forward_backward, device, args.repeats)
        result["fwd_bwd_peak_mb"] = _peak_mb(device, baseline)
    return result


def run_interleaved(args: argparse.Namespace) -> None:
    """Alternate ds-sparse-attn, its gathered path, compiled FlexAttention (forward only) and dense SDPA call
    by call in this process, so load from other processes hits all of them alike; prints best-of-repeats
    times and ratios to dense and to Flex."""
    from ds_sparse_attn import FixedSparsityConfig, SparseSelfAttention

    print(
        "| seq | method | fwd ms | fwd+bwd ms | fwd speed-up vs dense | fwd+bwd speed-up vs dense "
        "| fwd speed-up vs Flex |"
    )
    print("|---|---|---|---|---|---|---|")
    for seq in args.seqs:
        torch.manual_seed(0)
        config = FixedSparsityConfig(args.heads, args.block, num_local_blocks=4, num_global_blocks=1)
        q, k, v = (torch.randn(1, args.heads, seq, args.dim, requires_grad=True) for _ in range(3))
        grad = torch.randn_like(q)
        methods = {
            "ds-sparse-attn": SparseSelfAttention(config, max_seq_length=seq),
            "ds-sparse-attn-gather": SparseSelfAttention(config, max_seq_length=seq, backend="torch-gather"),
            "sdpa-dense": torch.nn.functional.scaled_dot_product_attention,
        }
        if "flex-compiled" in args.methods:
            methods["flex-compiled"] = _compiled_flex(config.make_layout(seq)[0].bool(), args.block, seq)
        with_dense = not (args.skip_dense_above and seq > args.skip_dense_above)
        methods = {
            name: fn
            for name, fn in methods.items()
            if name in args.methods or (name == "sdpa-dense" and with_dense)
        }
        times: dict[str, dict[str, list[float]]] = {name: {"fwd": [], "fwd_bwd": []} for name in methods}
        for fn in methods.values():  # warm-up (and Flex's compile)
            with torch.no_grad():
                fn(q.detach(), k.detach(), v.detach())
        for _ in range(args.repeats):
            for name, fn in methods.items():
                start = time.perf_counter()
                with torch.no_grad():  # Flex on CPU refuses inputs that require grad, even here
                    fn(q.detach(), k.detach(), v.detach())
                times[name]["fwd"].append(time.perf_counter() - start)
                if name == "flex-compiled":  # no CPU backward in torch 2.13
                    continue
                start = time.perf_counter()
                fn(q, k, v).backward(grad)
                times[name]["fwd_bwd"].append(time.perf_counter() - start)
        best = {
            name: {kind: min(ts, default=None) for kind, ts in kinds.items()} for name, kinds in times.items()
        }
        dense = best.get("sdpa-dense", {"fwd": None, "fwd_bwd": None})
        flex = best.get("flex-compiled")
        for name, b in best.items():
            cells = [
                _ms(b["fwd"]),
                _ms(b["fwd_bwd"]),
                _ratio(dense["fwd"], b["fwd"]),
                _ratio(dense["fwd_bwd"], b["fwd_bwd"]),
                _ratio(flex and flex["fwd"], b["fwd"]),
            ]
            print(f"| {seq} | {name} | " + " | ".join(cells) + " |")


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.0f}"


def _ratio(reference: float | None, seconds: float | None) -> str:
    return "-" if reference is None or seconds is None else f"{reference / seconds:.2f}x"


def _compiled_flex(blocks: torch.Tensor, block: int, seq: int):
    """FlexAttention compiled for a (nb, nb) block layout shared by all heads; compiles on its first call."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(b, h, q_idx, kv_idx):
        return blocks[q_idx // block, kv_idx // block]

    block_mask = create_block_mask(mask_mod, None, None, seq, seq, device="cpu", BLOCK_SIZE=block)
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["ds-sparse-attn", "ds-sparse-attn-gather", "flex-compiled", "sdpa-dense"],
        choices=["ds-sparse-attn", "ds-sparse-attn-gather", "flex-compiled", "sdpa-dense"],
    )
    parser.add_argument(
        "--skip-dense-above", type=int, default=None, help="skip dense SDPA above this length"
    )
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument(
        "--interleaved",
        action="store_true",
        help="CPU: alternate the --methods (and dense SDPA) call by call in one process",
    )
    parser.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args)))
        return
    if args.interleaved:
        run_interleaved(args)
        return
    rows = []
    for seq in args.seqs:
        for method in args.methods:
            if method == "sdpa-dense" and args.skip_dense_above and seq > args.skip_dense_above:
                continue
            command = [sys.executable, __file__, "--case", "--seq", str(seq), "--method", method]
            for name in ("device", "heads", "dim", "block", "dtype", "repeats"):
                command += [f"--{name}", str(getattr(args, name))]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{method} at {seq} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"done: {method} {seq}", file=sys.stderr)
    print_table(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    print(
        f"\n{args.device}, {args.dtype}, batch 1, {args.heads} heads, head dim {args.dim}, block {args.block}, "
        f"fixed layout (4 local blocks, 1 global), median of {args.repeats}\n"
    )
    print(
        "| seq | method | density | fwd ms | fwd+bwd ms | fwd peak MB | fwd+bwd peak MB | compile s | fwd speed-up vs dense | ideal (1/density) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    dense = {r["seq"]: r for r in rows if r["method"] == "sdpa-dense"}
    for r in rows:
        base = dense.get(r["seq"])
        speedup = f"{base['fwd_s'] / r['fwd_s']:.2f}x" if base else "-"
        compile_s = f"{r['compile_s']:.1f}" if r["compile_s"] is not None else "-"
        fwd_bwd = "n/a" if r["fwd_bwd_s"] is None else f"{r['fwd_bwd_s'] * 1e3:.0f}"
        fwd_bwd_mb = "n/a" if r["fwd_bwd_peak_mb"] is None else f"{r['fwd_bwd_peak_mb']:.0f}"
        print(
            f"| {r['seq']} | {r['method']} | {r['density']:.3f} | {r['fwd_s'] * 1e3:.0f} | {fwd_bwd} | "
            f"{r['fwd_peak_mb']:.0f} | {fwd_bwd_mb} | {compile_s} | {speedup} | {1 / r['density']:.2f}x |"
        )


if __name__ == "__main__":
    main()
