"""Rank functions of test_engine_nvme_faults.py: the engine with its optimizer state on disk, under faults."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

import ds_engine
import torch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 1),
    )


def _config(offload: dict) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "sub_group_size": 1024,  # several sub-groups: a kill can land between them
            "offload_optimizer": offload,
        },
    }


def _nvme(path: str) -> dict:
    os.makedirs(path, exist_ok=True)
    return {
        "device": "nvme",
        "nvme_path": path,
        "buffer_count": 2,
        "pipeline_read": True,
        "pipeline_write": True,
    }


def _engine(offload: dict):
    with ds_engine.zero.Init(config_dict_or_path=_config(offload)):
        model = _model()
    return ds_engine.initialize(model=model, config=_config(offload))[0]


def _steps(engine, rank: int, first: int, n: int) -> list[float]:
    losses = []
    for step in range(first, first + n):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(2, 16, generator=g)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def digest(folder: str) -> str:
    """One hash over every file's relative path and bytes under ``folder``."""
    h = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return h.hexdigest()


def train_save_then_die(rank: int, world: int, root: str) -> None:
    """2 steps with nvme offload, a checkpoint, then rank 0 is SIGKILLed in the middle of its next optimizer
    step (after two sub-groups were updated and written back)."""
    engine = _engine(_nvme(os.path.join(root, "nvme")))
    _steps(engine, rank, 0, 2)
    engine.save_checkpoint(os.path.join(root, "ckpt"))
    torch.distributed.barrier()
    if rank == 0:
        Path(root, "ckpt.sha256").write_text(digest(os.path.join(root, "ckpt")))
        opt = engine.optimizer
        real, seen = opt._master_updated, []

        def die_mid_step(*args) -> None:
            real(*args)
            seen.append(1)
            if len(seen) == 2:
                Path(root, "killed").write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)

        opt._master_updated = die_mid_step
    _steps(engine, rank, 2, 1)


def main() -> None:
    """``python _nvme_engine_workers.py ROOT`` under torch.distributed's environment variables: one rank of
    ``train_save_then_die`` (the test starts the processes itself, to see rank 0's SIGKILL and to stop
    rank 1, which waits for rank 0 in its next collective)."""
    import sys

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    train_save_then_die(torch.distributed.get_rank(), torch.distributed.get_world_size(), sys.argv[1])


if __name__ == "__main__":
    main()


def resume_one_rank(rank: int, world: int, root: str) -> dict:
    """At 1 rank: the 2-rank nvme checkpoint resumed with nvme (on the killed run's swap folder) and with
    CPU offload; and a disk that fills in the first step, with a checkpoint saved before it (unchanged
    after; that a checkpoint loads after a failure is the resume above)."""
    out: dict = {}
    stale = os.path.join(root, "nvme", "ds_swap", f"rank{rank:05d}")
    out["stale_before"] = sorted(os.listdir(stale))
    out["rank_folders_before"] = sorted(os.listdir(os.path.dirname(stale)))
    out["stale_mtimes"] = {n: os.stat(os.path.join(stale, n)).st_mtime_ns for n in out["stale_before"]}
    for name, offload in (("nvme", _nvme(os.path.join(root, "nvme"))), ("cpu", {"device": "cpu"})):
        engine = _engine(offload)
        if name == "nvme":  # the killed run's files were removed when the swap folder was made
            out["fresh_files"] = {n: os.stat(os.path.join(stale, n)).st_mtime_ns for n in os.listdir(stale)}
            out["rank_folders_after"] = sorted(os.listdir(os.path.dirname(stale)))
        path, _ = engine.load_checkpoint(os.path.join(root, "ckpt"))
        out[f"{name}_loaded"] = path
        out[f"{name}_losses"] = _steps(engine, rank, 2, 2)
        del engine

    # disk full in the first step: the state files do not fit (the masters and gradients do); the checkpoint
    # is untouched
    small = os.path.join(root, "small")
    engine = _engine(_nvme(small))
    engine.save_checkpoint(os.path.join(root, "ckpt0"))
    out["ckpt0_before"] = digest(os.path.join(root, "ckpt0"))
    try:
        _steps(engine, rank, 0, 1)
        out["full_error"] = None
    except OSError as e:
        out["full_error"] = f"{type(e).__name__}: {e}"
    out["ckpt0_after"] = digest(os.path.join(root, "ckpt0"))
    return out
