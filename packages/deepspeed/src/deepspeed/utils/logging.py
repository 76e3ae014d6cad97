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
    """Set ``logger``'s (or ``custom_logger``'s) level, and its handlers', from a name: debug, info, warning,
    error, critical (any case)."""
    level = LOG_LEVELS.get(log_level_str.lower())
    if level is None:
        raise ValueError(
            f"{log_level_str} is not one of the valid logging levels. Valid log levels are {LOG_LEVELS.keys()}."
        )
    target = custom_logger if custom_logger is not None else logger
    target.setLevel(level)
    for handler in target.handlers:
        handler.setLevel(level)


__all__ = ["LOG_LEVELS", "log_dist", "logger", "print_json_dist", "set_log_level_from_string"]
