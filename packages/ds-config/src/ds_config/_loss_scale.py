"""``LossScaleConfig``: what a loss scaler reports, under the names of DeepSpeed's ``optimizer.loss_scale_config``.

Defined here, in the package every other one may import, so that the loss scalers (ds-precision) make it and
the optimizers that hold a scaler (ds-precision's wrapper, ds-zero's stages) hand it out without importing
each other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LossScaleConfig"]


@dataclass(frozen=True)
class LossScaleConfig:
    """A snapshot of a loss scaler's settings and state, field by field as DeepSpeed 0.19.8 names them.

    ``use_grad_scaling`` is False without a scaler (fp32, bf16): the scale is then 1.0 and the dynamic
    fields are None, as in DeepSpeed. A static scale has ``dynamic_loss_scale`` False and the dynamic fields
    None. A snapshot does not move with the scaler: read ``optimizer.loss_scale_config`` again for the
    current values (DeepSpeed's stage-0 object is the live state; setting its fields is not supported here).
    """

    use_grad_scaling: bool
    dynamic_loss_scale: bool
    cur_iter: int
    cur_scale: float
    last_overflow_iter: int | None = None
    scale_factor: float | None = None
    scale_window: int | None = None
    min_loss_scale: float | None = None

    @classmethod
    def unscaled(cls) -> LossScaleConfig:
        """The snapshot of an optimizer without a loss scaler (fp32, bf16)."""
        return cls(use_grad_scaling=False, dynamic_loss_scale=False, cur_iter=0, cur_scale=1.0)
