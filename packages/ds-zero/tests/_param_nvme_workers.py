"""Rank workers for the NVMe parameter offload tests (run by rank_testing.spawn: real processes, gloo, real files)."""

from __future__ import annotations

import dataclasses
import os
import time

import _stage3_workers as w
import torch
import torch.distributed as dist
from ds_zero import ZeroConfigError, ZeroStage3Optimizer
from ds_zero.stage3 import Stage3Options
from ds_zero.stage3._options import NvmeOptions, ParamNvmeOptions
from ds_zero.stage3._swap import NvmeSpaceError, SwapFolder
from rank_testing import live_storage_bytes
from torch import nn

BASE = Stage3Options(param_persistence_threshold=0, sub_group_size=24)


def _dir(root: str, name: str) -> str:
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    return path


def _nvme(root: str, name: str, *, optimizer: bool = True, base: Stage3Options = BASE, **kw) -> Stage3Options:
    path = _dir(root, name)
    return dataclasses.replace(
        base,
        param_nvme=ParamNvmeOptions(path, **kw),
        optimizer_nvme=NvmeOptions(path, buffer_count=2) if optimizer else None,
        offload_optimizer=not optimizer,
    )


def _train(rank: int, world: int, options: Stage3Options, dtype: torch.dtype, steps: int = 3, first: int = 0,
           built=None) -> tuple[list[float], ZeroStage3Optimizer]:  # fmt: skip
    model, zero = built or w.build(options, dtype=dtype)
    swap = zero.params.swap
    if swap is not None:  # at each sub-group's optimizer step: the weight writes left in flight before it
        inner, zero.pending_at_step = zero.optimizer.step, []

        def sampled(*args, **kwargs):  # noqa: ANN202
            zero.pending_at_step.append((swap.writes_pending(), zero.aio.stats.queued))
            return inner(*args, **kwargs)

        zero.optimizer.step = sampled
    writes_before = swap.piece_writes if swap is not None else 0
    losses = []
    for step in range(first, first + steps):
        for micro in range(2):
            x, y = w.batch(step, world, micro)
            mine = slice(rank * w.MB, (rank + 1) * w.MB)
            loss = w.loss_of(model, x[mine], y[mine]) / 2
            losses.append(loss.item())
            zero.backward(loss)
        zero.step()
    if swap is not None:  # pieces written by the steps, against the pieces in the files
        zero.step_piece_writes = swap.piece_writes - writes_before
        zero.file_pieces = sum(p.cpu is None for ps in swap.groups for p in ps) * steps
    return losses, zero


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def parity(rank: int, world: int, root: str, full: bool) -> dict:
    """Losses and weights with the parameters (and the optimizer) on nvme equal no offload and CPU offload
    (``full``: every variant in fp32; else, and in bf16, both on nvme with nothing kept in memory)."""
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        tag = str(dtype).split(".")[-1]
        ref_losses, ref = _train(rank, world, BASE, dtype)
        ref_w = ref.fp32_state_dict()
        runs = {"nvme-both": _nvme(root, f"{tag}-b", max_in_cpu=0, buffer_count=2)}
        if full and dtype == torch.float32:
            runs.update({
                "cpu": dataclasses.replace(BASE, offload_param=True, offload_optimizer=True),
                "nvme-param": _nvme(root, f"{tag}-p", optimizer=False, max_in_cpu=0),
                "nvme-half": _nvme(root, f"{tag}-h", max_in_cpu=40),
            })  # fmt: skip
        for name, options in runs.items():
            losses, zero = _train(rank, world, options, dtype)
            out[f"{tag}/{name}"] = {
                "loss": max(abs(a - b) for a, b in zip(losses, ref_losses)),
                "weights": _max_diff(zero.fp32_state_dict(), ref_w),
                "reads": zero.params.swap.reads if zero.params.swap else None,
                "pending_at_step": getattr(zero, "pending_at_step", None),
                "writes_behind": zero.params.swap.writes_behind if zero.params.swap else None,
                "writes_chained": zero.params.swap.writes_chained if zero.params.swap else None,
                "step_piece_writes": getattr(zero, "step_piece_writes", None),
                "file_pieces_x_steps": getattr(zero, "file_pieces", None),
                "settled": zero.params.swap.settled if zero.params.swap else None,
            }
    return out


class Deep(nn.Module):
    """Sixteen 128x128 layers: partitions large against one swap buffer, to see where they are stored."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(128, 128) for _ in range(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _deep(options: Stage3Options):
    torch.manual_seed(0)
    model = Deep()
    zero = ZeroStage3Optimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-3), options)
    return model, zero


def _deep_steps(model, zero, rank: int, steps: int = 2, on_forward=None) -> None:
    handles = []
    if on_forward is not None:  # registered after stage 3's own hooks: runs once the module's fetch is done
        handles = [m.register_forward_pre_hook(on_forward) for m in model.layers]
    for step in range(steps):
        for micro in range(2):
            g = torch.Generator().manual_seed(10 * step + micro + 100 * rank)
            zero.backward(model(torch.randn(4, 128, generator=g)).pow(2).mean())
        zero.step()
    for h in handles:
        h.remove()


def effects(rank: int, world: int, root: str) -> dict:
    """Where the partitions are, what the buffers and the read-ahead do (the Deep model, both on nvme)."""
    out: dict = {}
    # gathers one layer ahead; the swap reads go on further (as far as the free buffers allow)
    base = dataclasses.replace(BASE, sub_group_size=8192, prefetch_bucket_size=16_512)
    for name, max_in_cpu in (("disk", 0), ("half", 66_048), ("ram", 10**9)):
        model, zero = _deep(_nvme(root, f"where-{name}", max_in_cpu=max_in_cpu, buffer_count=2, buffer_size=16_384,
                                  base=base))  # fmt: skip
        swap = zero.params.swap
        seen: list[int] = []
        _deep_steps(model, zero, rank, on_forward=lambda m, i, s=seen, sw=swap: s.append(sw.ahead()))
        folder = swap.folder.path
        if name == "disk":  # nothing in memory, two buffers
            out["buffers-2"] = _buffers(swap, seen)
        out[name] = {
            "folder": folder,
            "files": {f: os.path.getsize(os.path.join(folder, f)) for f in sorted(os.listdir(folder))},
            "file_numel": swap.file_numel,
            "cpu_numel": swap.cpu_numel,
            "partition_numel": zero.params.part_numels[0],
            "live_bytes": live_storage_bytes(),
        }
        del model, zero, swap
    model, zero = _deep(_nvme(root, "buffers-5", max_in_cpu=0, buffer_count=5, buffer_size=16_384, base=base))
    swap = zero.params.swap
    seen = []
    _deep_steps(model, zero, rank, on_forward=lambda m, i, s=seen, sw=swap: s.append(sw.ahead()))
    out["buffers-5"] = _buffers(swap, seen)
    model, zero = _deep(_nvme(root, "no-prefetch", max_in_cpu=0, buffer_count=5, buffer_size=16_384,
                              base=dataclasses.replace(base, prefetch_bucket_size=0)))  # fmt: skip
    swap = zero.params.swap
    seen = []
    _deep_steps(model, zero, rank, on_forward=lambda m, i: seen.append(swap.ahead()))
    out["no-prefetch"] = {"ahead_at_forward": seen, "reads_ahead": swap.reads_ahead}
    try:
        _deep(_nvme(root, "small-buffer", max_in_cpu=0, buffer_size=1000, base=base))
        out["small_buffer"] = "no error"
    except ZeroConfigError as e:
        out["small_buffer"] = str(e)
    return out


def _buffers(swap, seen: list[int]) -> dict:
    return {
        "allocated": swap.buffers_allocated,
        "peak_in_use": swap.peak_buffers_in_use,
        "buffer_bytes": [b.numel() for b in swap._free],
        "ahead_at_forward": seen,
        "reads_ahead": swap.reads_ahead,
        "reads": swap.reads,
    }


def faults(rank: int, world: int, root: str) -> dict:
    out: dict = {}
    for name, path in (
        ("missing", os.path.join(root, "no-such-dir")),
        ("readonly", os.path.join(root, "ro")),
    ):
        if name == "readonly" and not os.path.ismount(
            path
        ):  # root writes anywhere: the test mounts it read-only
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o500)
        options = dataclasses.replace(BASE, param_nvme=ParamNvmeOptions(path), offload_optimizer=True)
        try:
            w.build(options)
            out[name] = "no error"
        except ZeroConfigError as e:
            out[name] = str(e)
    # a killed run's parameter swap files: emptied at start, never read as the weights
    stale = os.path.join(root, "stale", "ds_swap_params", f"rank{rank:05d}")
    os.makedirs(stale, exist_ok=True)
    with open(os.path.join(stale, "g0.param.bin"), "wb") as f:
        f.write(b"\xff" * (1 << 16))
    with open(os.path.join(stale, "leftover.bin"), "wb") as f:
        f.write(b"x")
    ref_losses, _ = _train(rank, world, BASE, torch.float32)
    losses, _ = _train(rank, world, _nvme(root, "stale", max_in_cpu=0), torch.float32)
    out["stale_loss_diff"] = max(abs(a - b) for a, b in zip(losses, ref_losses))
    out["stale_files"] = sorted(os.listdir(stale))
    out["vanished"] = _vanished_ranks(rank, root)
    # a disk too small for the parameter files (a 4 KiB tmpfs the test mounts; each rank needs 8 KiB or
    # more): an error at construction, before any collective
    small = os.path.join(root, "small")
    if os.path.ismount(small):
        try:
            w.build(
                dataclasses.replace(
                    BASE, param_nvme=ParamNvmeOptions(small, max_in_cpu=0), offload_optimizer=True
                )
            )
            out["disk_full"] = "no error"
        except NvmeSpaceError as e:
            out["disk_full"] = str(e)
    return out


def _vanished_ranks(rank: int, root: str) -> dict:
    """Swap folders of ranks this 2-rank run does not have (ds made them for ranks 2-4 of an earlier, larger
    run): removed at start, except rank 4's, which a live process still holds (another job on the same
    nvme_path), and rank00005, which ds did not make (no marker)."""
    path = _dir(root, "vanish")
    folders = os.path.join(path, "ds_swap_params")
    live = None
    if rank == 0:
        for r in (2, 3):
            SwapFolder(path, r, "offload_param", name="ds_swap_params")  # made, marked and released
        live = SwapFolder(path, 4, "offload_param", name="ds_swap_params")
        os.makedirs(os.path.join(folders, "rank00005"))
    dist.barrier()
    before = sorted(os.listdir(folders))
    dist.barrier()  # both listed before either removes
    w.build(
        dataclasses.replace(BASE, param_nvme=ParamNvmeOptions(path, max_in_cpu=0), offload_optimizer=True)
    )
    dist.barrier()
    del live
    return {"before": before, "after": sorted(os.listdir(folders))}


def checkpoint(rank: int, world: int, root: str) -> dict:
    """Save with the parameters on disk, load into a fresh nvme run and into a no-offload run: the next two
    steps' losses equal an uninterrupted run's."""
    full_losses, _ = _train(rank, world, BASE, torch.float32, steps=4)
    _, nvme = _train(rank, world, _nvme(root, "ckpt-a", max_in_cpu=0), torch.float32, steps=2)
    tensors, meta = nvme.sharded_state_dict()
    module_state = nvme.module_state_dict()
    out = {}
    for name, options in (("nvme", _nvme(root, "ckpt-b", max_in_cpu=0)), ("none", BASE)):
        model, zero = w.build(options)
        torch.manual_seed(123)  # different weights than the saved ones
        zero.load_module_state_dict(module_state)
        zero.load_sharded_state_dict(tensors, meta)
        losses, _ = _train(rank, world, options, torch.float32, steps=2, first=2, built=(model, zero))
        out[name] = max(abs(a - b) for a, b in zip(losses, full_losses[4:]))
    return out


def main(rank: int, world: int, root: str, full: bool) -> dict:
    """Parity; with ``full`` also the effects, the faults and a checkpoint round trip (with seconds taken)."""
    out: dict = {"seconds": {}}
    parts = {"parity": lambda: parity(rank, world, root, full)}
    if full:
        parts.update(effects=lambda: effects(rank, world, root), faults=lambda: faults(rank, world, root),
                     checkpoint=lambda: checkpoint(rank, world, root))  # fmt: skip
    for name, run in parts.items():
        t0 = time.perf_counter()
        out[name] = run()
        out["seconds"][name] = round(time.perf_counter() - t0, 1)
    return out
