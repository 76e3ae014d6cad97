"""DeepSpeed's ``deepspeed.runtime.utils``: the helpers user code calls (``see_memory_usage``,
``move_to_device``, ``set_random_seed``, ``ensure_directory_exists``, ``empty_cache``; deepspeed.utils._utils). The
module's other names are DeepSpeed's internal helpers, listed as absent with the reason in
docs/deepspeed-api.md."""

from deepspeed.utils._utils import (
    empty_cache,
    ensure_directory_exists,
    move_to_device,
    see_memory_usage,
    set_random_seed,
)

__all__ = ["empty_cache", "ensure_directory_exists", "move_to_device", "see_memory_usage", "set_random_seed"]
