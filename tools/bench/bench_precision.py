"""Per-step overhead of ds_precision.MixedPrecisionOptimizer against the plain torch fp32 optimizer step.

A ~50M-parameter model (a stack of square Linear layers) trains in bf16 with fp32 master weights and
gradient clipping; the baseline is the same torch optimizer stepping the same model in fp32, with the same
gradients. The overhead (overflow check + global norm, unscale/clip, grad copy into fp32, copy-back to
bf16) is ``wrapper step - plain fp32 step`` of the same inner optimizer (torch's default, foreach and fused
AdamW), also as a ratio of the plain step, for the wrapper's torch-op path and its Numba path
(``numba_kernels=True``, the ``ds-precision[fast]`` extra). Not ``wrapper - inner step timed alone``: the
wrapper lets go of its fp32 gradients after each step, so its inner optimizer stepped alone has none and
does nothing. Prints a markdown table.

    .venv/bin/python tools/bench/bench_precision.py [--params-m 50] [--repeats 7] [--threads N] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _record import provenance, write  # tools/bench: this script's folder, first on sys.path
from ds_precision import MixedPrecisionOptimizer

WIDTH = 2048  # 12 layers of 2048x2048 (+bias) = 50.4M parameters


def build(n_params: int, dtype: torch.dtype, device: str) -> torch.nn.Module:
    layers = max(1, round(n_params / (WIDTH * WIDTH + WIDTH)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    model = model.to(device=device, dtype=dtype)
    for p in model.parameters():  # gradients as backward would leave them
        p.grad = torch.randn_like(p) * 1e-3
    return model


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(step, device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - t0


IMPLS = {  # AdamW implementation name -> constructor keywords
    "default (for-loop on CPU)": {},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def make_optimizer(params, impl: str) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-6, **IMPLS[impl])


def measure(n_params: int, repeats: int, device: str, impl: str) -> dict[str, float]:
    """Median seconds of each variant; the variants run interleaved so machine load hits all alike."""
    fp32 = build(n_params, torch.float32, device)
    plain = make_optimizer(fp32.parameters(), impl)
    wrapped = {}
    for path, numba_kernels in (("torch", False), ("numba", True)):
        bf16 = build(n_params, torch.bfloat16, device)
        wrapped[path] = MixedPrecisionOptimizer(
            make_optimizer(bf16.parameters(), impl),
            dtype=torch.bfloat16,
            clip_grad=1.0,
            numba_kernels=numba_kernels,
        )

    def plain_with_clip() -> None:
        torch.nn.utils.clip_grad_norm_(fp32.parameters(), 1.0)
        plain.step()

    variants = {
        "plain": plain.step,  # the plain torch fp32 optimizer step
        "plain_clip": plain_with_clip,  # what an fp32 user with gradient clipping runs
        # bf16 model: copy, norm/overflow, unscale+clip, inner step, copy-back
        "wrapped_torch": wrapped["torch"].step,
        "wrapped_numba": wrapped["numba"].step,
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(repeats + 2):
        for name, step in variants.items():
            t = timed(step, device)
            if i >= 2:  # two warm-up rounds
                times[name].append(t)
    if any(w.skipped_steps for w in wrapped.values()):
        raise RuntimeError("the benchmark's gradients overflowed; the timings would not be of real steps")
    result: dict = {k: statistics.median(v) for k, v in times.items()}
    result["params"] = sum(f.numel for f in wrapped["torch"].groups)
    result["all_s"] = times  # every timed step of every variant: the spread
    return result


def compile_seconds() -> float:
    """One-off cost of the first Numba step in a process: compiling, or loading numba's disk cache."""
    model = build(1000, torch.bfloat16, "cpu")
    opt = MixedPrecisionOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), dtype=torch.bfloat16, numba_kernels=True
    )
    t0 = time.perf_counter()
    opt.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params-m", type=float, default=50.0, help="model size in millions of parameters")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="write the record (tools/bench/_record.py's envelope) here")
    args = ap.parse_args()
    started = provenance()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, "
        f"median of {args.repeats} steps\n"
    )
    first_numba_s = compile_seconds()
    print(f"first Numba step in this process (JIT compile or cache load): {first_numba_s:.2f} s\n")
    print(
        "| AdamW impl | params | plain fp32 step (ms) | plain fp32 clip+step (ms) "
        "| wrapper step, torch path (ms) | overhead, torch path | wrapper step, Numba path (ms) "
        "| overhead, Numba path |"
    )
    print("|---|---|---|---|---|---|---|---|")
    results = {}
    for impl in IMPLS:
        r = results[impl] = measure(int(args.params_m * 1e6), args.repeats, args.device, impl)
        cells = [impl, f"{r['params'] / 1e6:.1f}M"]
        cells += [f"{r[k] * 1e3:.1f}" for k in ("plain", "plain_clip")]
        for path in ("torch", "numba"):
            overhead = r[f"wrapped_{path}"] - r["plain"]
            cells += [
                f"{r[f'wrapped_{path}'] * 1e3:.1f}",
                f"{overhead * 1e3:.1f} ms = {overhead / r['plain']:.1%}",
            ]
        print("| " + " | ".join(cells) + " |")
    for r in results.values():
        for path in ("torch", "numba"):
            r[f"overhead_{path}_fraction_of_plain"] = (r[f"wrapped_{path}"] - r["plain"]) / r["plain"]
    write(args.json, {"settings": vars(args), "threads": torch.get_num_threads(),
                      "first_numba_step_s": first_numba_s, "results_median_s": results}, started)  # fmt: skip


if __name__ == "__main__":
    main()
