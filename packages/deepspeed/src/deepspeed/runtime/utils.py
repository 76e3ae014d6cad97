"""DeepSpeed's ``deepspeed.runtime.utils``: ``see_memory_usage`` (ds_engine.utils). The module's other names are
DeepSpeed's internal helpers, listed as absent with the reason in docs/deepspeed-api.md."""

from ds_engine.utils import see_memory_usage

__all__ = ["see_memory_usage"]
