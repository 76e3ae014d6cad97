"""Activation checkpointing with DeepSpeed's ``deepspeed.checkpointing`` API.

``configure(mpu, deepspeed_config, ...)`` sets the behaviour once per process;
``checkpoint(function, *args)`` keeps only the inputs of ``function`` and recomputes the rest in
backward with the same RNG states; ``get_rng_tracker()`` and ``model_parallel_manual_seed()`` give
model-parallel regions their own RNG stream.
"""

from ._checkpoint import checkpoint
from ._errors import ActivationCheckpointingConfigError, CheckpointBuffersExhaustedError, RNGTrackerError
from ._profile import ActivationProfile
from ._rng import RNGStatesTracker, get_rng_tracker, model_parallel_manual_seed
from ._state import ActivationCheckpointingSettings, configure, get_profile, is_configured, reset

# DeepSpeed's names for the same objects, so `import ... as checkpointing` code runs unchanged.
CudaRNGStatesTracker = RNGStatesTracker
get_cuda_rng_tracker = get_rng_tracker
model_parallel_cuda_manual_seed = model_parallel_manual_seed

__all__ = [
    "ActivationCheckpointingConfigError",
    "ActivationCheckpointingSettings",
    "ActivationProfile",
    "CheckpointBuffersExhaustedError",
    "CudaRNGStatesTracker",
    "RNGStatesTracker",
    "RNGTrackerError",
    "checkpoint",
    "configure",
    "get_cuda_rng_tracker",
    "get_profile",
    "get_rng_tracker",
    "is_configured",
    "model_parallel_cuda_manual_seed",
    "model_parallel_manual_seed",
    "reset",
]
