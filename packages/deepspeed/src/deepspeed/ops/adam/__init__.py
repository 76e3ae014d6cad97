"""``deepspeed.ops.adam``: ``FusedAdam`` and ``DeepSpeedCPUAdam``, the classes ds_optim builds for the config's
``Adam``/``AdamW`` (so ``isinstance`` checks against them hold for config-built optimizers too)."""

from __future__ import annotations

from ds_optim import DeepSpeedCPUAdam, FusedAdam

__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
