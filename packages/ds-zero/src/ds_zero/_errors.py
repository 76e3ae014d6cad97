"""Exception types raised by ds_zero."""

from __future__ import annotations

__all__ = ["ZeroAssertionError", "ZeroConfigError"]


class ZeroConfigError(ValueError):
    """An option or combination of options that ZeRO cannot honour; the message says what to change."""


class ZeroAssertionError(ZeroConfigError, AssertionError):
    """A :class:`ZeroConfigError` where DeepSpeed fails an ``assert`` (an untested optimizer without
    ``zero_allow_untested_optimizer``, an unused parameter with ``ignore_unused_parameters: false``).

    It is also an ``AssertionError``, so code written against DeepSpeed that catches ``AssertionError``
    there catches it; code catching ds's ``ZeroConfigError`` or ``ValueError`` does too.
    """


class OptimizerStateKeyError(ZeroConfigError, KeyError):
    """An optimizer state a parameter does not have (an unknown key, or any key before the first step).

    DeepSpeed raises ``KeyError`` here at stage 3 and ``ValueError`` at stages 1 and 2; this is both.
    """

    def __str__(self) -> str:  # KeyError's would print the message quoted
        return str(self.args[0]) if self.args else ""
