"""Activation memory and step time of a 12-layer transformer on CPU, with and without checkpointing.

Usage: .venv/bin/python tools/bench_activation_checkpointing.py [--layers 12 --width 128 --seq 128 ...]

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

import torch
from ds_checkpoint.activation import checkpoint
from torch import nn

MODES = ("plain", "checkpointed")


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
        self.use_checkpoint = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)  # (B, T, C)
        for block in self.blocks:
            h = checkpoint(block, h) if self.use_checkpoint else block(h)
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
    model.use_checkpoint = args.rss_mode == "checkpointed"
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
        f"--{k}={getattr(args, k)}" for k in ("layers", "width", "heads", "seq", "batch", "vocab")
    ]
    # Every allocation of 64 KiB or more gets its own mmap, returned to the OS when freed, so the
    # RSS follows live tensor memory instead of glibc's retained heap.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out)["delta_kib"] / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per mode (after one warm-up)")
    parser.add_argument("--rss-mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_mode:
        rss_worker(args)
        return

    model, tokens = build(args)
    memory: dict[str, tuple[int, int]] = {}
    for mode in MODES:
        model.use_checkpoint = mode == "checkpointed"
        step(model, tokens)  # warm-up
        memory[mode] = measure_saved_bytes(model, tokens)
    wall_ms: dict[str, list[float]] = {m: [] for m in MODES}
    cpu_ms: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.steps):
        for mode in MODES:
            model.use_checkpoint = mode == "checkpointed"
            start, start_cpu = time.perf_counter(), time.process_time()
            step(model, tokens)
            wall_ms[mode].append((time.perf_counter() - start) * 1e3)
            cpu_ms[mode].append((time.process_time() - start_cpu) * 1e3)
    rss_mib = {mode: peak_rss_delta_mib(args, mode) for mode in MODES}
    report(args, memory, wall_ms, cpu_ms, rss_mib)


def report(
    args: argparse.Namespace,
    memory: dict[str, tuple[int, int]],
    wall_ms: dict[str, list[float]],
    cpu_ms: dict[str, list[float]],
    rss_mib: dict[str, float],
) -> None:
    """Print the markdown table, the checkpointed/plain ratios and the target verdicts."""
    mib = 1024**2
    print(
        f"{args.layers} layers, width {args.width}, {args.heads} heads, seq {args.seq}, batch {args.batch}, "
        f"vocab {args.vocab}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"median of {args.steps} interleaved steps\n"
    )
    print(
        "| mode | step wall time (ms) | step CPU time (ms) | saved activations, peak (MiB) "
        "| saved at end of forward (MiB) | peak RSS delta (MiB) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for mode in MODES:
        peak, fwd = memory[mode]
        wall, cpu = statistics.median(wall_ms[mode]), statistics.median(cpu_ms[mode])
        print(
            f"| {mode} | {wall:.1f} | {cpu:.1f} | {peak / mib:.1f} | {fwd / mib:.1f} | {rss_mib[mode]:.1f} |"
        )
    ratio = {
        "wall": statistics.median(wall_ms["checkpointed"]) / statistics.median(wall_ms["plain"]),
        "cpu": statistics.median(cpu_ms["checkpointed"]) / statistics.median(cpu_ms["plain"]),
        "peak": memory["checkpointed"][0] / memory["plain"][0],
        "fwd": memory["checkpointed"][1] / memory["plain"][1],
        "rss": rss_mib["checkpointed"] / rss_mib["plain"],
    }
    print(
        f"| checkpointed / plain | {ratio['wall']:.2f}x | {ratio['cpu']:.2f}x | 1/{1 / ratio['peak']:.1f} "
        f"| 1/{1 / ratio['fwd']:.1f} | 1/{1 / ratio['rss']:.1f} |"
    )
    for clock in ("wall", "cpu"):
        verdict = "met" if ratio["peak"] <= 1 / 4 and ratio[clock] <= 1.4 else "NOT met"
        print(f"\nTarget (peak activation memory >= 4x smaller, {clock} step time <= 1.4x): {verdict}")


if __name__ == "__main__":
    main()
