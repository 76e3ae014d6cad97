"""DeepSpeed's ``deepspeed.checkpointing`` API (activation checkpointing), from ds-checkpoint.

``non_reentrant_checkpoint`` is ds's one ``checkpoint``: DeepSpeed added it for functions whose inputs do not
require grad, which ds's ``checkpoint`` already handles (gradients reach the parameters the function uses).
Like ds's ``checkpoint``, and unlike DeepSpeed's non-reentrant one, it raises RuntimeError under
``torch.autograd.grad``: use ``loss.backward()``.
"""

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

non_reentrant_checkpoint = checkpoint

__all__ = [
    "checkpoint",
    "configure",
    "get_cuda_rng_tracker",
    "get_rng_tracker",
    "is_configured",
    "model_parallel_cuda_manual_seed",
    "model_parallel_manual_seed",
    "non_reentrant_checkpoint",
    "reset",
]
