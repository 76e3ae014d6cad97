"""DeepSpeed's ``deepspeed.utils.exceptions``."""

__all__ = ["DeprecatedException"]


class DeprecatedException(Exception):
    """A DeepSpeed API that DeepSpeed itself retired (it raises this, naming the replacement)."""
