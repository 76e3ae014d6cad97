"""Rank workers for the NVMe optimizer offload tests (run by rank_testing.spawn: real processes, gloo, real files)."""

from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager

import _stage3_workers as w
import torch
from ds_zero import ZeroConfigError, ZeroStage3Optimizer
from ds_zero.stage3 import Stage3Options, _subgroups
from ds_zero.stage3._options import NvmeOptions
from ds_zero.stage3._swap import NvmeSpaceError
from rank_testing import live_storage_bytes
from torch import nn

BASE = Stage3Options(param_persistence_threshold=0, sub_group_size=24)


def _nvme(path: str, **kw) -> Stage3Options:
    return dataclasses.replace(BASE, optimizer_nvme=NvmeOptions(path, **kw))


def _run(rank: int, world: int, options: Stage3Options, dtype: torch.dtype, steps: int = 3):
    model, zero = w.build(options, dtype=dtype)
    w.train(model, zero, rank, world, steps=steps, gas=2)
    return model, zero


def _losses(
    rank: int, world: int, options: Stage3Options, dtype: torch.dtype, clip: float = 0.0, gas: int = 2
):
    """Losses of 3 steps of ``gas`` micro-steps (and the optimizer), ``clip``: gradient_clipping."""
    model, zero = w.build(options, dtype=dtype, clip=clip)
    losses = []
    for step in range(3):
        for micro in range(gas):
            x, y = w.batch(step, world, micro)
            mine = slice(rank * w.MB, (rank + 1) * w.MB)
            loss = w.loss_of(model, x[mine], y[mine]) / gas
            losses.append(loss.item())
            zero.backward(loss)
        zero.step()
    return losses, zero


def grad_parity(rank: int, world: int, root: str) -> dict:
    """Gradients in files (optimizer on nvme) against in memory (no offload): losses, weights and the norm
    in fp32 and bf16, with gradient accumulation 1 and 2, with and without gradient_clipping (0.05 clips
    every step here)."""
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        tag = str(dtype).split(".")[-1]
        for gas, clip in ((2, 0.0), (2, 0.05), (1, 0.05)):
            ref_losses, ref = _losses(rank, world, BASE, dtype, clip, gas)
            ref_w = ref.fp32_state_dict()
            for name, options in (
                ("nvme", _nvme(_dir(root, f"gp-{tag}-{gas}-{clip}"), buffer_count=2, pipeline_read=True)),
            ):
                losses, zero = _losses(rank, world, options, dtype, clip, gas)
                out[f"{tag}/gas{gas}/clip{clip}/{name}"] = {
                    "loss": max(abs(a - b) for a, b in zip(losses, ref_losses)),
                    "weights": _max_diff(zero.fp32_state_dict(), ref_w),
                    "norm": abs(zero.global_grad_norm - ref.global_grad_norm),
                    "read_adds": getattr(zero.grad_parts, "read_adds", None),
                }
    return out


@contextmanager
def _step_piece(elements: int | None):
    """Views of at most ``elements`` (``_subgroups.STEP_PIECE``, 4M elements, patched) while inside."""
    old = _subgroups.STEP_PIECE
    _subgroups.STEP_PIECE = elements or old
    try:
        yield
    finally:
        _subgroups.STEP_PIECE = old


def _dir(root: str, name: str) -> str:
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    return path


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def parity_and_effects(rank: int, world: int, root: str, small: str | None) -> dict:
    """Weights after 3 steps with nvme equal those without offload and with CPU offload; what nvme did."""
    out: dict = {"parity": {}, "runs": {}}
    for dtype in (torch.float32, torch.bfloat16):
        tag = str(dtype).split(".")[-1]
        _, none = _run(rank, world, BASE, dtype)
        ref = none.fp32_state_dict()
        _, cpu = _run(rank, world, dataclasses.replace(BASE, offload_optimizer=True), dtype)
        out["parity"][f"{tag}/cpu"] = _max_diff(cpu.fp32_state_dict(), ref)
        for name, kw in {
            "plain": dict(buffer_count=1),
            "pipelined": dict(buffer_count=3, pipeline_read=True, pipeline_write=True),
            "units": dict(buffer_count=2),  # views of 8 (STEP_PIECE below), sub-groups of 24: 3 views each
        }.items():
            with _step_piece(8 if name == "units" else None):
                _, zero = _run(rank, world, _nvme(_dir(root, f"{tag}-{name}"), **kw), dtype)
            out["parity"][f"{tag}/nvme-{name}"] = _max_diff(zero.fp32_state_dict(), ref)
            swap, stats = zero.swap, zero.aio.stats
            folder = swap.folder.path
            out["runs"][f"{tag}/{name}"] = {
                "folder": folder,
                "files": {f: os.path.getsize(os.path.join(folder, f)) for f in sorted(os.listdir(folder))},
                "partition_numel": zero.params.parts[0].numel(),
                "master_storage_bytes": zero.masters[0].untyped_storage().nbytes(),
                "view_storage_bytes": sum(v.untyped_storage().nbytes() for v in swap.views[0]),
                "state_bytes_in_memory": sum(
                    t.untyped_storage().nbytes()
                    for st in zero.optimizer.state.values()
                    for t in st.values()
                    if torch.is_tensor(t) and t.dim() == 1
                ),
                "bytes_read": stats.bytes_read,
                "bytes_written": stats.bytes_written,
                "buffers_allocated": swap.peak_buffers,
                "buffers_alive_after": swap.buffers_allocated,
                "reads_ahead": swap.reads_ahead,
                "prefetched": swap.prefetched,
                "writes_deferred": swap.writes_deferred,
                "views": sum(len(vs) for vs in swap.views),
                "units": len(swap.units),
                "buffer_bytes": swap.buffer_bytes,
                "grad_itemsize": dtype.itemsize,
                "grad_bytes_written": getattr(zero.grad_parts, "bytes_written", 0),
                "grad_bytes_read": getattr(zero.grad_parts, "bytes_read", 0),
                "norm_bytes_read": getattr(zero.grad_parts, "norm_bytes_read", 0),
            }
            # the checkpoint state is the one of the CPU-offload run, read from the files
            t_nvme, _ = zero.sharded_state_dict()
            t_cpu, _ = cpu.sharded_state_dict()
            out["parity"][f"{tag}/state-{name}"] = max(
                (t_nvme[k].float() - t_cpu[k].float()).abs().max().item() for k in t_cpu
            )
    out["grads"] = grad_parity(rank, world, root)
    for name, fn in (("overflow", overflow), ("fragments", fragments)):
        out[name] = {where: fn(rank, world, root, nvme) for where, nvme in (("ram", False), ("nvme", True))}
    out["resume"] = resume(rank, world, root)
    out["faults"] = faults(rank, world, root)
    out["disk_full"] = disk_full(rank, world, small) if small else None
    return out


def resume(rank: int, world: int, root: str) -> dict:
    """Load a CPU-offload run's state into a fresh nvme optimizer; two more steps match the CPU run's."""
    _, cpu = _run(rank, world, dataclasses.replace(BASE, offload_optimizer=True), torch.float32, steps=2)
    tensors, meta = cpu.sharded_state_dict()
    model, nvme = w.build(_nvme(_dir(root, "resume"), buffer_count=2), dtype=torch.float32)
    nvme.load_sharded_state_dict(tensors, meta)
    cpu_model = cpu.module
    w.train(cpu_model, cpu, rank, world, steps=2, gas=2, first=2)
    w.train(model, nvme, rank, world, steps=2, gas=2, first=2)
    return {"diff": _max_diff(nvme.fp32_state_dict(), cpu.fp32_state_dict())}


def faults(rank: int, world: int, root: str) -> dict:
    out = {}
    for name, path in (
        ("missing", os.path.join(root, "no-such-dir")),
        ("readonly", os.path.join(root, "ro")),
    ):
        if name == "readonly":
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o500)
        try:
            _run(rank, world, _nvme(path), torch.float32, steps=0)
            out[name] = "no error"
        except ZeroConfigError as e:
            out[name] = str(e)
    # a previous run's stale swap files are scratch: emptied, never read as state
    stale = os.path.join(root, "stale", "ds_swap", f"rank{rank:05d}")
    os.makedirs(stale, exist_ok=True)
    for name in ("g0.master.bin", "g0.grad.bin"):  # a killed run's masters and gradients
        with open(os.path.join(stale, name), "wb") as f:
            f.write(b"\xff" * 4096)
    with open(os.path.join(stale, "leftover.bin"), "wb") as f:
        f.write(b"x")
    _, zero = _run(rank, world, _nvme(os.path.join(root, "stale")), torch.float32)
    _, ref = _run(rank, world, BASE, torch.float32)
    out["stale_diff"] = _max_diff(zero.fp32_state_dict(), ref.fp32_state_dict())
    out["stale_files"] = sorted(os.listdir(stale))
    return out


def disk_full(rank: int, world: int, path: str) -> dict:
    """On a file system too small for the optimizer state: the first step fails naming the bytes needed."""
    try:
        _run(rank, world, _nvme(path), torch.float32, steps=1)
        return {"error": None}
    except NvmeSpaceError as e:
        return {"error": str(e)}


def overflow(rank: int, world: int, root: str, nvme: bool) -> dict:
    """fp16 with a loss scaler, an inf gradient on the last rank: the step is skipped on every rank (the
    gradient files' inf found by the norm's re-read; the reads issued ahead of it dropped), the next applied."""
    from _workers import HalvingScaler

    torch.manual_seed(0)
    model = w.Net().half()
    options = _nvme(_dir(root, "overflow"), buffer_count=2, pipeline_read=True) if nvme else BASE
    scaler = HalvingScaler(1024.0)
    zero = ZeroStage3Optimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), options, scaler=scaler)
    before = zero.module_state_dict()  # the weights, gathered: no swap read (fp32_state_dict's would drop
    x, y = w.batch(0, world)  # the reads issued ahead of the skipped step, which this checks are dropped)
    mine = slice(rank * w.MB, (rank + 1) * w.MB)
    zero.backward(w.loss_of(model, x[mine], y[mine]) * (float("inf") if rank == world - 1 else 1.0))
    skipped = not zero.step()
    unchanged = _max_diff(zero.module_state_dict(), before) == 0.0
    zero.backward(w.loss_of(model, x[mine], y[mine]))
    applied = zero.step()
    return {"skipped": skipped, "unchanged": unchanged, "applied": applied, "weights": zero.fp32_state_dict()}


def fragments(rank: int, world: int, root: str, nvme: bool) -> dict:
    """``full_grad`` after a backward (DeepSpeed's safe_get_full_grad), then ``set_full_grad`` of one parameter
    and a step: read from and written into the gradient files, as in memory."""
    options = _nvme(_dir(root, "fragments"), buffer_count=2) if nvme else BASE
    model, zero = w.build(options)
    x, y = w.batch(0, world)
    mine = slice(rank * w.MB, (rank + 1) * w.MB)
    zero.backward(w.loss_of(model, x[mine], y[mine]))
    grads = {n: zero.full_grad(p).clone() for n, p in model.named_parameters() if p.requires_grad}
    zero.set_full_grad(model.l1.weight, torch.full(grads["l1.weight"].shape, 0.5))  # the whole shape
    zero.step()
    return {"grads": grads, "weights": zero.fp32_state_dict()}


# ---------------------------------------------------------------------------------- gradients on disk (1 rank)
BIG = 1024  # sixteen 1024 x 1024 layers: a 64 MiB fp32 gradient partition on one rank, 4 MiB per layer


def _big(options: Stage3Options):
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(BIG, BIG, bias=False) for _ in range(16)))
    return model, ZeroStage3Optimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-3), options)


def grads_on_disk(rank: int, world: int, root: str, tiny: str | None) -> dict:
    """Where a 64 MiB gradient partition lives between backward and step: live tensor bytes after each
    micro-step's backward above those before it, in memory (CPU offload) and with the optimizer on nvme;
    the gradient file; a disk too small for it."""
    out: dict = {}
    base = dataclasses.replace(BASE, reduce_bucket_size=1 << 20, sub_group_size=1 << 20)
    for name, options in (
        ("ram", dataclasses.replace(base, offload_optimizer=True)),
        ("nvme", dataclasses.replace(base, optimizer_nvme=NvmeOptions(_dir(root, "big"), buffer_count=2))),
    ):
        model, zero = _big(options)
        before = live_storage_bytes()
        grown = []
        for micro in range(2):
            g = torch.Generator().manual_seed(micro)
            zero.backward(model(torch.randn(2, BIG, generator=g)).pow(2).mean())
            grown.append(live_storage_bytes() - before)
        zero.step()
        run = {"grown": grown, "partition_bytes": zero.params.part_numels[0] * 4}
        if zero.swap is not None:
            folder = zero.swap.folder.path
            run["files"] = {f: os.path.getsize(os.path.join(folder, f)) for f in sorted(os.listdir(folder))}
            run["peak_staged_bytes"] = getattr(zero.grad_parts, "peak_staged_bytes", None)
            run["read_adds"] = getattr(zero.grad_parts, "read_adds", None)
        out[name] = run
        del model, zero
    if tiny is not None:  # a file system with room for less than the gradient file: an error at construction
        try:
            _big(dataclasses.replace(base, optimizer_nvme=NvmeOptions(tiny)))
            out["disk_full"] = None
        except NvmeSpaceError as e:
            out["disk_full"] = str(e)
    out["parity"] = grad_parity(rank, world, root)
    return out


# ---------------------------------------------------------------------------------- glibc's mmap threshold
def mmap_threshold(rank: int, world: int, root: str) -> dict:
    """glibc's mmap threshold as ``_heap`` set it (process-wide: run in a fresh rank process) before any
    optimizer, after one with its state in memory (CPU offload), after two on nvme; the INFO lines logged."""
    import logging

    from ds_zero.stage3 import _heap

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("ds_zero")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    out = {"before": _heap.mmap_threshold}
    w.build(dataclasses.replace(BASE, offload_optimizer=True))
    out["cpu"] = _heap.mmap_threshold
    for i in range(2):
        w.build(_nvme(_dir(root, f"mmap{i}")))
    out["nvme"] = _heap.mmap_threshold
    out["logged"] = [line for line in lines if "mmap threshold" in line]
    return out
