"""Rank workers for the NVMe optimizer offload tests (run by rank_testing.spawn: real processes, gloo, real files)."""

from __future__ import annotations

import dataclasses
import os

import _stage3_workers as w
import torch
from ds_zero import ZeroConfigError
from ds_zero.stage3 import Stage3Options
from ds_zero.stage3._options import NvmeOptions
from ds_zero.stage3._swap import NvmeSpaceError

BASE = Stage3Options(param_persistence_threshold=0, sub_group_size=24)


def _nvme(path: str, **kw) -> Stage3Options:
    return dataclasses.replace(BASE, optimizer_nvme=NvmeOptions(path, **kw))


def _run(rank: int, world: int, options: Stage3Options, dtype: torch.dtype, steps: int = 3):
    model, zero = w.build(options, dtype=dtype)
    w.train(model, zero, rank, world, steps=steps, gas=2)
    return model, zero


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
        }.items():
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
                "buffers_allocated": swap.buffers_allocated,
                "reads_ahead": swap.reads_ahead,
                "prefetched": swap.prefetched,
                "writes_deferred": swap.writes_deferred,
                "views": sum(len(vs) for vs in swap.views),
            }
            # the checkpoint state is the one of the CPU-offload run, read from the files
            t_nvme, _ = zero.sharded_state_dict()
            t_cpu, _ = cpu.sharded_state_dict()
            out["parity"][f"{tag}/state-{name}"] = max(
                (t_nvme[k].float() - t_cpu[k].float()).abs().max().item() for k in t_cpu
            )
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
    with open(os.path.join(stale, "g0.master.bin"), "wb") as f:
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
