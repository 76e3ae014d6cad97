"""``deepspeed.ops.lamb.FusedLamb``: ``ds_optim.Lamb`` with DeepSpeed's constructor arguments."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from ds_optim import Lamb

__all__ = ["FusedLamb"]


class FusedLamb(Lamb):
    """DeepSpeed's ``FusedLamb``. ``max_grad_norm`` is accepted and unused, as in DeepSpeed
    (clip with the config's ``gradient_clipping``)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        eps_inside_sqrt: bool = False,
        weight_decay: float = 0.0,
        max_grad_norm: float = 0.0,
        max_coeff: float = 10.0,
        min_coeff: float = 0.01,
        amsgrad: bool = False,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            bias_correction=bias_correction,
            betas=betas,
            eps=eps,
            eps_inside_sqrt=eps_inside_sqrt,
            weight_decay=weight_decay,
            max_coeff=max_coeff,
            min_coeff=min_coeff,
            amsgrad=amsgrad,
        )
