"""DeepSpeed's ``deepspeed.utils.logging``: ``logger`` (a real ``logging.Logger``) and ``log_dist``.

``logger`` is the ``ds_engine`` logger the engine writes to, so ``logger.setLevel(logging.WARNING)``
(Lightning does this) quiets the engine as it quiets DeepSpeed.
"""

from __future__ import annotations

import logging

from deepspeed.utils._utils import log_dist, logger, print_json_dist

LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def set_log_level_from_string(log_level_str: str, custom_logger: logging.Logger | None = None) -> None:
    """Set ``logger``'s (or ``custom_logger``'s) level from a name: debug, info, warning, error, critical."""
    level = LOG_LEVELS.get(log_level_str.lower())
    if level is None:
        raise ValueError(f"log level {log_level_str!r} is not one of {sorted(LOG_LEVELS)}")
    (custom_logger or logger).setLevel(level)


__all__ = ["LOG_LEVELS", "log_dist", "logger", "print_json_dist", "set_log_level_from_string"]
