"""DeepSpeed's ``deepspeed.utils``: ``logger``, ``log_dist``, ``RepeatingLoader``, the ``safe_get_*`` family.

``logger`` is the ``ds_engine`` logger the engine itself writes to, so a script's messages and the
engine's arrive in one stream with one format.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ds_engine import comm
from ds_engine._data import RepeatingLoader
from ds_engine._safe_get import (
    safe_get_full_fp32_param,
    safe_get_full_grad,
    safe_get_full_optimizer_state,
    safe_get_local_fp32_param,
    safe_get_local_grad,
    safe_get_local_optimizer_state,
    safe_set_full_fp32_param,
    safe_set_full_grad,
    safe_set_full_optimizer_state,
    safe_set_local_fp32_param,
    safe_set_local_grad,
    safe_set_local_optimizer_state,
)

__all__ = [
    "RepeatingLoader",
    "log_dist",
    "logger",
    "print_json_dist",
    "safe_get_full_fp32_param",
    "safe_get_full_grad",
    "safe_get_full_optimizer_state",
    "safe_get_local_fp32_param",
    "safe_get_local_grad",
    "safe_get_local_optimizer_state",
    "safe_set_full_fp32_param",
    "safe_set_full_grad",
    "safe_set_full_optimizer_state",
    "safe_set_local_fp32_param",
    "safe_set_local_grad",
    "safe_set_local_optimizer_state",
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
    """Write ``message`` as JSON to ``path`` on the listed ranks (DeepSpeed's helper for metrics files)."""
    if _selected(ranks):
        message = {**message, "rank": comm.get_rank()}
        with open(path, "w") as out:  # type: ignore[arg-type]
            json.dump(message, out)
