"""DeepSpeed's ``deepspeed.checkpointing`` API (activation checkpointing), from ds-checkpoint."""

from ds_checkpoint.activation import (
    checkpoint,
    configure,
    get_cuda_rng_tracker,
    get_rng_tracker,
    is_configured,
    model_parallel_cuda_manual_seed,
    model_parallel_manual_seed,
    reset,
)

__all__ = [
    "checkpoint",
    "configure",
    "get_cuda_rng_tracker",
    "get_rng_tracker",
    "is_configured",
    "model_parallel_cuda_manual_seed",
    "model_parallel_manual_seed",
    "reset",
]
