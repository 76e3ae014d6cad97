"""Exception types raised by ds_zero."""

from __future__ import annotations

__all__ = ["ZeroConfigError"]


class ZeroConfigError(ValueError):
    """An option or combination of options that ZeRO cannot honour; the message says what to change."""
