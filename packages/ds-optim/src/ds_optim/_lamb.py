"""LAMB (DeepSpeed's FusedLamb semantics) with multi-tensor updates and per-tensor norms in one call."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["Lamb"]


class Lamb(torch.optim.Optimizer):
    """Layer-wise adaptive Adam: each tensor's Adam update is rescaled by a clamped trust ratio.

    Per tensor: m, v Adam moments; u = m / (sqrt(v) + eps) (``eps_inside_sqrt``: sqrt(v + eps)), plus
    ``weight_decay * p``; trust = ||p|| / ||u|| clamped to [min_coeff, max_coeff], 1 when either norm is 0;
    p -= step_size * trust * u with step_size = lr * sqrt(1 - b2^t) / (1 - b1^t) (lr without bias
    correction). ||u|| uses the moments before bias correction, as DeepSpeed does.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        eps_inside_sqrt: bool = False,
        weight_decay: float = 0.0,
        max_coeff: float = 10.0,
        min_coeff: float = 0.01,
        amsgrad: bool = False,
    ) -> None:
        if amsgrad:
            raise ValueError("Lamb does not support amsgrad; remove 'amsgrad' from the optimizer params")
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(
                f"lr, eps and weight_decay must be non-negative, got {lr}, {eps}, {weight_decay}"
            )
        if not 0 < min_coeff <= max_coeff:
            raise ValueError(
                f"need 0 < min_coeff <= max_coeff, got min_coeff={min_coeff}, max_coeff={max_coeff}"
            )
        defaults = dict(
            lr=lr,
            bias_correction=bias_correction,
            betas=tuple(betas),
            eps=eps,
            eps_inside_sqrt=eps_inside_sqrt,
            weight_decay=weight_decay,
            max_coeff=max_coeff,
            min_coeff=min_coeff,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One LAMB update of every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _step_group(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        if any(g.is_sparse for g in grads):
            raise RuntimeError("Lamb does not support sparse gradients")
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
        exp_avgs = [self.state[p]["exp_avg"] for p in params]
        exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in params]
        beta1, beta2 = group["betas"]

        torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)  # m = b1 m + (1 - b1) g
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
        if group["eps_inside_sqrt"]:
            denoms = torch._foreach_sqrt(torch._foreach_add(exp_avg_sqs, group["eps"]))
        else:
            denoms = torch._foreach_add(torch._foreach_sqrt(exp_avg_sqs), group["eps"])
        updates = torch._foreach_div(exp_avgs, denoms)
        if group["weight_decay"] != 0:
            torch._foreach_add_(updates, params, alpha=group["weight_decay"])

        trust = self._trust_ratios(params, updates, group["min_coeff"], group["max_coeff"])
        step_size = group["lr"]
        if group["bias_correction"]:
            # Every tensor of a group is stepped together, so they share one step count.
            t = self.state[params[0]]["step"]
            step_size *= (1.0 - beta2**t) ** 0.5 / (1.0 - beta1**t)
        # One host sync for all tensors of the group, instead of one per tensor.
        scales = (trust * -step_size).tolist()
        torch._foreach_mul_(updates, scales)
        torch._foreach_add_(params, updates)

    @staticmethod
    def _trust_ratios(
        params: list[torch.Tensor], updates: list[torch.Tensor], min_coeff: float, max_coeff: float
    ) -> torch.Tensor:
        """||p|| / ||u|| per tensor (fp32), clamped; 1 where either norm is 0."""
        p_norms = torch.stack(torch._foreach_norm(params)).float()
        u_norms = torch.stack(torch._foreach_norm(updates)).float()
        ratio = (p_norms / u_norms).clamp(min_coeff, max_coeff)
        return torch.where((p_norms > 0) & (u_norms > 0), ratio, torch.ones_like(ratio))
