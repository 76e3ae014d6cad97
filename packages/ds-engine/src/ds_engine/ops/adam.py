"""``deepspeed.ops.adam``: ``FusedAdam`` and ``DeepSpeedCPUAdam``, both ``ds_optim.CPUAdam`` underneath.

``ds_optim.CPUAdam`` already is DeepSpeed's Adam (AdamW or L2 mode, optional bias correction) and runs
on any device torch's fused Adam supports, so these classes only translate DeepSpeed's constructor
arguments. Their class names are the ones ZeRO accepts as tested optimizers, as in DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from ds_optim import CPUAdam

__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]


class FusedAdam(CPUAdam):
    """DeepSpeed's ``FusedAdam``: ``adam_w_mode=True`` (default) is AdamW, False adds L2 to the gradient."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
    ) -> None:
        if amsgrad:
            raise RuntimeError(
                "FusedAdam does not support the AMSGrad variant; use torch.optim.Adam(amsgrad=True)"
            )
        # set_grad_none: zero_grad(set_to_none=True) is torch's default already
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            adamw_mode=adam_w_mode,
        )


class DeepSpeedCPUAdam(CPUAdam):
    """DeepSpeed's ``DeepSpeedCPUAdam`` (ZeRO-Offload's optimizer); state is kept in fp32 always."""

    def __init__(
        self,
        model_params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        adamw_mode: bool = True,
        fp32_optimizer_states: bool = True,
    ) -> None:
        if not fp32_optimizer_states:
            raise ValueError(
                "DeepSpeedCPUAdam(fp32_optimizer_states=False) is not supported by ds: optimizer state is "
                "always fp32; remove the argument"
            )
        super().__init__(
            model_params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            adamw_mode=adamw_mode,
            amsgrad=amsgrad,
        )
