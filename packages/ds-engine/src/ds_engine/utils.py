"""DeepSpeed's ``deepspeed.utils``: ``logger``, ``log_dist``, ``RepeatingLoader``, the ``safe_get_*`` family.

``logger`` is the ``ds_engine`` logger the engine itself writes to, so a script's messages and the
engine's arrive in one stream with one format.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ds_engine import _safe_get, comm
from ds_engine._data import RepeatingLoader
from ds_engine._safe_get import *  # noqa: F403 (the safe_get_* / safe_set_* family, listed in its __all__)

__all__ = ["RepeatingLoader", "log_dist", "logger", "print_json_dist", *_safe_get.__all__]

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
