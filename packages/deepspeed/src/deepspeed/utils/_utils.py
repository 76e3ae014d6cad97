"""DeepSpeed's ``deepspeed.utils``: ``logger``, ``log_dist``, ``RepeatingLoader``, the ``safe_get_*`` family;
and the ``deepspeed.runtime.utils`` helpers user code calls (``see_memory_usage``, ``move_to_device``,
``set_random_seed``, ``ensure_directory_exists``, ``empty_cache``).

``logger`` is the ``ds_engine`` logger the engine itself writes to, so a script's messages and the
engine's arrive in one stream with one format.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import random
from typing import Any

from ds_engine._data import RepeatingLoader

from deepspeed.comm import comm
from deepspeed.utils import _safe_get
from deepspeed.utils._safe_get import *  # noqa: F403 (the safe_get_* / safe_set_* family, listed in its __all__)

__all__ = [
    "RepeatingLoader",
    "empty_cache",
    "ensure_directory_exists",
    "log_dist",
    "logger",
    "move_to_device",
    "print_json_dist",
    "see_memory_usage",
    "set_random_seed",
    *_safe_get.__all__,
]

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
    """Write ``message`` with this process's ``"rank"`` added (into ``message`` itself, as DeepSpeed does) as JSON
    to ``path``: without a process group on every process (rank -1), with one on the listed ranks only (``[-1]``:
    all; None: none), DeepSpeed 0.19.8's rule."""
    initialized = comm.is_initialized()
    rank = comm.get_rank() if initialized else -1
    ranks = ranks or []
    if not initialized or (ranks and (ranks[0] == -1 or rank in ranks)):
        message["rank"] = rank
        with open(path, "w") as out:  # type: ignore[arg-type]
            json.dump(message, out)
            out.flush()
            os.fsync(out.fileno())


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


def move_to_device(item: Any, device: Any, criterion_func: Any = None) -> Any:
    """``item`` (a tensor, or lists/tuples/dicts of them, nested) on ``device``, as DeepSpeed's: containers are
    rebuilt, a tensor is ``.to(device)``; one that ``criterion_func`` accepts is moved in place (its ``.data``
    replaced, so the same object, a parameter too, now lives on ``device``) and returned."""
    if criterion_func is not None and criterion_func(item):
        item.data = item.to(device).data
        return item
    if isinstance(item, list):
        return [move_to_device(v, device, criterion_func) for v in item]
    if isinstance(item, tuple):
        return tuple(move_to_device(v, device, criterion_func) for v in item)
    if isinstance(item, dict):
        return {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
    return item.to(device)


def set_random_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator (seed mod 2**32; when NumPy is installed) and torch
    (seed mod 2**63), as DeepSpeed's."""
    import torch

    random.seed(seed)
    try:
        import numpy
    except ImportError:  # nothing of NumPy's to seed
        pass
    else:
        numpy.random.seed(seed % (2**32))
    torch.manual_seed(seed % (2**63))


def ensure_directory_exists(filename: str) -> None:
    """Create the directory ``filename`` is in (and its parents) if it does not exist."""
    os.makedirs(os.path.dirname(filename), exist_ok=True)


def empty_cache() -> None:
    """Free the accelerator's cached memory and reset its peak statistics (nothing to do on the CPU)."""
    from deepspeed.accelerator.real_accelerator import get_accelerator

    get_accelerator().empty_cache()
    get_accelerator().reset_peak_memory_stats()
