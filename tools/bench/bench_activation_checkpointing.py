"""Activation memory and step time of a 12-layer transformer on CPU, with and without checkpointing.

Usage: .venv/bin/python tools/bench/bench_activation_checkpointing.py [--sizes 128x128x4,512x256x2 --steps 5]

Four modes side by side at each size (WIDTHxSEQxBATCH): no checkpointing, ``ds_checkpoint``'s
``checkpoint`` around every block, and ``torch.utils.checkpoint.checkpoint`` with
``use_reentrant=True`` and ``use_reentrant=False`` around every block, so the overhead of this
implementation over torch's own is visible next to the cost of recomputation itself.

Activation memory is measured two ways:
1. Saved-tensor bytes (primary). A ``torch.autograd.graph.saved_tensors_hooks`` pair wraps every
   tensor autograd saves for backward (including the ones saved while recomputing inside
   backward) in a holder object; the holder's bytes count while autograd keeps it alive. Bytes are
   counted once per storage (views share storage) and parameters are excluded, so this is exactly
   the activation memory backward needs. Reported: the peak over forward+backward, and the amount
   still held when forward ends.
2. Peak RSS delta (cross-check). Each mode runs one training step in a fresh subprocess (with
   glibc's ``MALLOC_MMAP_THRESHOLD_=65536``, so freed tensors go back to the OS); reported is the
   peak anonymous resident memory minus the anonymous RSS just before the step (model, gradients
   and lazy initialisation already done by a one-sequence warm-up step; shared-library pages,
   which the kernel's peak also counts, are subtracted). It also counts transient buffers
   (e.g. gradients of activations in flight), so it is larger than (1).
Step time is the median over interleaved steps (modes alternate, so load on a shared machine
hits both alike), without the measuring hooks: wall time, and the process's CPU time (all
threads), which is the steadier of the two when other processes compete for the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.utils.checkpoint as torch_checkpoint
from _record import provenance, write  # tools/bench: this script's folder, first on sys.path
from ds_checkpoint.activation import checkpoint
from torch import nn

Wrap = Callable[[nn.Module, torch.Tensor], torch.Tensor]
# mode -> how each block is called (None: directly)
WRAPS: dict[str, Wrap | None] = {
    "plain": None,
    "ds checkpoint": checkpoint,
    "torch reentrant": lambda block, h: torch_checkpoint.checkpoint(block, h, use_reentrant=True),
    "torch non-reentrant": lambda block, h: torch_checkpoint.checkpoint(block, h, use_reentrant=False),
}
MODES = tuple(WRAPS)
# torch's non-reentrant checkpoint packs saved tensors with its own saved_tensors_hooks, which
# take precedence over the meter's, so the meter cannot see what it keeps: only RSS covers it.
METER_BLIND = {"torch non-reentrant"}
# Timed alongside the steps: what one extra forward costs, so 1 + forward/plain step is the ratio to
# expect from any checkpointing that recomputes every block once. An estimate, not a bound: it also
# counts the head and loss (not recomputed), and a checkpointed step keeps fewer tensors alive,
# which can make the rest of it a little cheaper than the plain step.
NO_GRAD = "forward only, no grad"


class Block(nn.Module):
    """Pre-norm transformer block (causal attention, 4x MLP, dropout 0.1)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        hs = c // self.heads
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, hs).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs)
        scores = (q @ k.transpose(-1, -2)) / hs**0.5  # (B, nh, T, T)
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = self.drop(torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1))
        x = x + self.drop(self.proj((att @ v).transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.fc2(nn.functional.gelu(self.fc1(self.ln2(x)))))


class Model(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.width)
        self.blocks = nn.ModuleList(Block(args.width, args.heads) for _ in range(args.layers))
        self.head = nn.Linear(args.width, args.vocab)
        self.wrap: Wrap | None = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)  # (B, T, C)
        for block in self.blocks:
            h = self.wrap(block, h) if self.wrap is not None else block(h)
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), tokens.flatten())


class SavedBytesMeter:
    """Live bytes of tensors saved for backward, deduplicated by storage, parameters excluded."""

    def __init__(self, model: nn.Module) -> None:
        self._param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._live: dict[int, list[int]] = {}  # storage ptr -> [holders alive, nbytes]
        self.current_bytes = 0
        self.peak_bytes = 0

    def pack(self, tensor: torch.Tensor) -> object:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._param_ptrs:
            return tensor
        entry = self._live.setdefault(ptr, [0, storage.nbytes()])
        if entry[0] == 0:
            self.current_bytes += entry[1]
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        entry[0] += 1
        return _Held(tensor, self, ptr)

    def unpack(self, held: object) -> torch.Tensor:
        return held.tensor if isinstance(held, _Held) else held

    def release(self, ptr: int) -> None:
        entry = self._live[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.current_bytes -= entry[1]
            del self._live[ptr]


class _Held:
    """Holds one saved tensor; autograd dropping it (after its node's backward) ends its count."""

    def __init__(self, tensor: torch.Tensor, meter: SavedBytesMeter, ptr: int) -> None:
        self.tensor, self._meter, self._ptr = tensor, meter, ptr

    def __del__(self) -> None:
        self._meter.release(self._ptr)


def build(args: argparse.Namespace) -> tuple[Model, torch.Tensor]:
    torch.manual_seed(0)
    model = Model(args)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq))
    return model, tokens


def step(model: Model, tokens: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(tokens).backward()


def measure_saved_bytes(model: Model, tokens: torch.Tensor) -> tuple[int, int]:
    """(peak over forward+backward, held at the end of forward) in bytes."""
    meter = SavedBytesMeter(model)
    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        loss = model(tokens)
        after_forward = meter.current_bytes
        loss.backward()
    return meter.peak_bytes, after_forward


def _memory_status_kib() -> dict[str, int]:
    """VmHWM (peak RSS), RssAnon and RssFile of this process, from /proc/self/status."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon", "RssFile", "RssShmem"):
                fields[key] = int(value.split()[0])
    return fields


def rss_worker(args: argparse.Namespace) -> None:
    """Subprocess body: print the anonymous-memory peak increase over one step, as JSON."""
    model, tokens = build(args)
    model.wrap = WRAPS[args.rss_mode]
    # Warm-up on one sequence: lazy initialisation and gradients happen here, and its peak stays
    # below the full batch's, so the peak afterwards is the measured step's.
    model(tokens[:1]).backward()
    before = _memory_status_kib()
    model(tokens).backward()
    after = _memory_status_kib()
    # The kernel's peak (VmHWM) also counts pages of shared libraries touched for the first time
    # (which vary with which kernels the step happens to pick); file pages are never unmapped here,
    # so subtracting the final file-backed RSS leaves the peak of anonymous (tensor) memory.
    anon_peak_kib = after["VmHWM"] - after["RssFile"] - after["RssShmem"]
    print(json.dumps({"delta_kib": anon_peak_kib - before["RssAnon"]}))


def peak_rss_delta_mib(args: argparse.Namespace, mode: str) -> float:
    cmd = [sys.executable, __file__, "--rss-mode", mode] + [
        f"--{k}={getattr(args, k)}"
        for k in ("layers", "width", "heads", "seq", "batch", "vocab", "threads")
        if getattr(args, k) is not None
    ]
    # Every allocation of 64 KiB or more gets its own mmap, returned to the OS when freed, so the
    # RSS follows live tensor memory instead of glibc's retained heap.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out)["delta_kib"] / 1024


def parse_size(text: str) -> tuple[int, int, int]:
    """``WIDTHxSEQxBATCH`` -> (width, seq, batch)."""
    try:
        width, seq, batch = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r} must be WIDTHxSEQxBATCH, e.g. 512x256x2") from None
    return width, seq, batch


def run_size(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every mode at one size: memory first, then interleaved timed steps, then RSS subprocesses."""
    model, tokens = build(args)
    rows: dict[str, dict[str, float]] = {m: {} for m in MODES}
    for mode in MODES:
        model.wrap = WRAPS[mode]
        step(model, tokens)  # warm-up
        peak, at_forward_end = measure_saved_bytes(model, tokens)
        rows[mode].update(peak=peak / 1024**2, fwd=at_forward_end / 1024**2)
    wall_ms: dict[str, list[float]] = {m: [] for m in (*MODES, NO_GRAD)}
    cpu_ms: dict[str, list[float]] = {m: [] for m in (*MODES, NO_GRAD)}
    for _ in range(args.steps):
        for mode in (*MODES, NO_GRAD):
            model.wrap = WRAPS.get(mode)
            start, start_cpu = time.perf_counter(), time.process_time()
            if mode == NO_GRAD:
                with torch.no_grad():
                    model(tokens)
            else:
                step(model, tokens)
            wall_ms[mode].append((time.perf_counter() - start) * 1e3)
            cpu_ms[mode].append((time.process_time() - start_cpu) * 1e3)
    for mode in (*MODES, NO_GRAD):
        rows.setdefault(mode, {}).update(
            wall=statistics.median(wall_ms[mode]), cpu=statistics.median(cpu_ms[mode])
        )
        rows[mode]["wall_all"], rows[mode]["cpu_all"] = (
            wall_ms[mode],
            cpu_ms[mode],
        )  # the spread, for the record
        if not args.no_rss and mode != NO_GRAD:
            rows[mode]["rss"] = peak_rss_delta_mib(args, mode)
    return rows


def per_call_overhead_us(calls: int = 20, repeats: int = 200) -> dict[str, float]:
    """Microseconds per checkpointed call of a near-free function (``x * 2`` on 4x4), forward + backward.

    The function costs almost nothing, so this is each implementation's own bookkeeping: RNG
    capture/restore, saving inputs, the autograd node and the nested backward. Median of
    ``repeats`` interleaved chains of ``calls`` calls.
    """
    x = torch.randn(4, 4, requires_grad=True)

    def chain(wrap: Wrap | None) -> None:
        h = x
        for _ in range(calls):
            h = wrap(_twice, h) if wrap is not None else _twice(h)
        h.sum().backward()

    times: dict[str, list[float]] = {m: [] for m in MODES}
    for mode in MODES:
        chain(WRAPS[mode])  # warm-up
    for _ in range(repeats):
        for mode in MODES:
            start = time.process_time()
            chain(WRAPS[mode])
            times[mode].append((time.process_time() - start) / calls * 1e6)
    return {mode: statistics.median(t) for mode, t in times.items()}


def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument(
        "--sizes",
        type=lambda text: [parse_size(s) for s in text.split(",")],
        default=[(128, 128, 4), (512, 256, 2), (768, 256, 2)],
        help="comma-separated WIDTHxSEQxBATCH (default 128x128x4,512x256x2,768x256x2); heads = max(4, width/64)",
    )
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per mode (after one warm-up)")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocesses")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads (default: torch's); 1 keeps CPU times honest on an oversubscribed machine, "
        "where waiting OpenMP threads spin and bill CPU time",
    )
    # One size, for the RSS subprocess.
    for name in ("width", "heads", "seq", "batch"):
        parser.add_argument(f"--{name}", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rss-mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument(
        "--json", default=None, help="write the record (tools/bench/_record.py's envelope) here"
    )
    args = parser.parse_args()
    started = provenance()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.rss_mode:
        rss_worker(args)
        return

    print(
        f"{args.layers} layers, vocab {args.vocab}; torch {torch.__version__}, {torch.get_num_threads()} "
        f"threads; median of {args.steps} interleaved steps; load average before: {os.getloadavg()[0]:.1f}\n"
    )
    overhead = per_call_overhead_us()
    print("### Per-call cost of a near-free function (x * 2 on 4x4), forward + backward, CPU time\n")
    print("| mode | us per call | over plain (us) |\n|---|---:|---:|")
    for mode, us in overhead.items():
        print(f"| {mode} | {us:.1f} | {us - overhead['plain']:.1f} |")
    results = []
    for width, seq, batch in args.sizes:
        size = argparse.Namespace(**vars(args))
        size.__dict__.update(width=width, heads=max(4, width // 64), seq=seq, batch=batch)
        rows = run_size(size)
        report_size(size, rows)
        results.append((size, rows))
    report_summary(results)
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    sizes = [
        {"width": a.width, "heads": a.heads, "seq": a.seq, "batch": a.batch, "modes": rows}
        for a, rows in results
    ]
    write(
        args.json,
        {"settings": vars(args) | {"sizes": args.sizes}, "per_call_us": overhead, "sizes": sizes},
        started,
    )


def _ratio(rows: dict[str, dict[str, float]], mode: str, key: str, base: str = "plain") -> float:
    return rows[mode][key] / rows[base][key]


def report_size(args: argparse.Namespace, rows: dict[str, dict[str, float]]) -> None:
    """One markdown table: each mode's times and memory, with its ratio to the plain run."""
    print(f"\n### width {args.width}, {args.heads} heads, seq {args.seq}, batch {args.batch}\n")
    rss = "rss" in rows["plain"]
    print(
        "| mode | step wall (ms) | step CPU (ms) | wall / plain | CPU / plain | saved activations, peak (MiB) "
        "| saved at end of forward (MiB) |" + (" peak RSS delta (MiB) |" if rss else "")
    )
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if rss else ""))
    for mode, row in rows.items():
        if mode == NO_GRAD:
            print(
                f"| {mode} | {row['wall']:.1f} | {row['cpu']:.1f} | {_ratio(rows, mode, 'wall'):.2f}x "
                f"| {_ratio(rows, mode, 'cpu'):.2f}x | | |" + (" |" if rss else "")
            )
            continue
        saved = ("n/a", "n/a") if mode in METER_BLIND else (f"{row['peak']:.1f}", f"{row['fwd']:.1f}")
        print(
            f"| {mode} | {row['wall']:.1f} | {row['cpu']:.1f} | {_ratio(rows, mode, 'wall'):.2f}x "
            f"| {_ratio(rows, mode, 'cpu'):.2f}x | {saved[0]} | {saved[1]} |"
            + (f" {row['rss']:.1f} |" if rss else "")
        )


def report_summary(results: list[tuple[argparse.Namespace, dict[str, dict[str, float]]]]) -> None:
    """Ratios per size, and ds_checkpoint against torch's reentrant checkpoint, with the verdicts."""
    print("\n### Summary (ratios to plain; target: peak saved activations >= 4x smaller, step <= 1.4x)\n")
    print(
        "| size (width x seq x batch) | memory: ds peak saved | ds wall | ds CPU | torch reentrant wall "
        "| torch non-reentrant wall | ds / torch reentrant wall | ds / torch reentrant CPU "
        "| recompute estimate: 1 + no-grad forward / plain (wall, CPU) | target |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    ds = "ds checkpoint"
    for args, rows in results:
        memory = _ratio(rows, ds, "peak")
        wall, cpu = _ratio(rows, ds, "wall"), _ratio(rows, ds, "cpu")
        verdict = "met" if memory <= 1 / 4 and wall <= 1.4 else "NOT met"
        print(
            f"| {args.width} x {args.seq} x {args.batch} | 1/{1 / memory:.1f} | {wall:.2f}x | {cpu:.2f}x "
            f"| {_ratio(rows, 'torch reentrant', 'wall'):.2f}x | {_ratio(rows, 'torch non-reentrant', 'wall'):.2f}x "
            f"| {_ratio(rows, ds, 'wall', 'torch reentrant'):.2f}x | {_ratio(rows, ds, 'cpu', 'torch reentrant'):.2f}x "
            f"| {1 + _ratio(rows, NO_GRAD, 'wall'):.2f}x, {1 + _ratio(rows, NO_GRAD, 'cpu'):.2f}x "
            f"| {verdict} (wall) |"
        )


if __name__ == "__main__":
    main()
