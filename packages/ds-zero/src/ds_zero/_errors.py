"""Exception types raised by ds_zero."""

from __future__ import annotations

__all__ = ["StateDictMismatchError", "ZeroAssertionError", "ZeroConfigError"]


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


class StateDictMismatchError(ZeroConfigError, RuntimeError):
    """A strict load of a full state dict at stage 3 whose names differ from the module's.

    Worded and typed as torch's ``Module.load_state_dict`` (a ``RuntimeError``, which DeepSpeed raises at every
    stage), e.g. for a checkpoint saved with ``exclude_frozen_parameters=True`` loaded without
    ``load_module_strict=False``.
    """

    def __init__(self, module: object, missing: list[str], unexpected: list[str]) -> None:
        self.missing, self.unexpected = list(missing), list(unexpected)
        msgs = []
        if missing:
            msgs.append("Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
        if unexpected:
            msgs.append(
                "Unexpected key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in unexpected))
            )
        super().__init__(
            "Error(s) in loading state_dict for {}:\n\t{}".format(type(module).__name__, "\n\t".join(msgs))
        )
