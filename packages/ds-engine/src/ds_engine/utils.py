"""DeepSpeed's ``deepspeed.utils``: ``logger``, ``log_dist``, ``RepeatingLoader``, the ``safe_get_*`` family.

``logger`` is the ``ds_engine`` logger the engine itself writes to, so a script's messages and the
engine's arrive in one stream with one format.
"""

from __future__ import annotations

import gc
import json
import logging
from typing import Any

from ds_engine import _safe_get, comm
from ds_engine._data import RepeatingLoader
from ds_engine._safe_get import *  # noqa: F403 (the safe_get_* / safe_set_* family, listed in its __all__)

__all__ = ["RepeatingLoader", "log_dist", "logger", "print_json_dist", "see_memory_usage", *_safe_get.__all__]

logger = logging.getLogger("ds_engine")


def _selected(ranks: list[int] | None) -> bool:
    """True when this rank should print: ``ranks`` None or [-1] mean every rank."""
    rank = comm.get_rank()
    return ranks is None or -1 in ranks or rank in ranks


def log_dist(message: str, ranks: list[int] | None = None, level: int = logging.INFO) -> None:
    """Log ``message`` on the listed ranks only (all ranks when ``ranks`` is None or contains -1)."""
    if _selected(ranks):
        logger.log(level, "[Rank %d] %s", comm.get_rank(), message)


def print_json_dist(message: dict[str, Any], ranks: list[int] | None = None, path: str | None = None) -> None:
    """Write ``message`` as JSON to ``path`` on the listed ranks (DeepSpeed's helper for metrics files)."""
    if _selected(ranks):
        message = {**message, "rank": comm.get_rank()}
        with open(path, "w") as out:  # type: ignore[arg-type]
            json.dump(message, out)


def see_memory_usage(message: str, force: bool = False) -> None:
    """DeepSpeed's ``deepspeed.runtime.utils.see_memory_usage``: with ``force``, rank 0 prints ``message``, the
    accelerator's allocated/reserved memory and their peaks (GB; zeros without CUDA) and the host's used
    memory (``/proc/meminfo``), then resets the peaks. Without ``force`` it does nothing, as DeepSpeed's."""
    if not force or comm.get_rank() != 0:
        return
    import torch

    gc.collect()  # count what Python would free
    gb = 1024**3
    cuda = torch.cuda.is_available()
    allocated, max_allocated, reserved, max_reserved = (
        (
            torch.cuda.memory_allocated(),
            torch.cuda.max_memory_allocated(),
            torch.cuda.memory_reserved(),
            torch.cuda.max_memory_reserved(),
        )
        if cuda
        else (0, 0, 0, 0)
    )
    print(message)
    print(
        f"MA {allocated / gb:.2f} GB Max_MA {max_allocated / gb:.2f} GB "
        f"CA {reserved / gb:.2f} GB Max_CA {max_reserved / gb:.2f} GB"
    )
    meminfo = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            meminfo[key] = int(rest.split()[0]) * 1024
    used = meminfo["MemTotal"] - meminfo["MemAvailable"]
    print(
        f"CPU Virtual Memory:  used = {used / gb:.2f} GB, percent = {100 * used / meminfo['MemTotal']:.1f}%"
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
