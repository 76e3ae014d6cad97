"""CPUAdam: Adam/AdamW for ZeRO offload on fp32 master weights, with an optional low-precision copy.

The update runs on torch's fused Adam kernel (``torch._fused_adam_``/``torch._fused_adamw_``), which ships
compiled with torch, so nothing is compiled at install or first use. A Numba ``prange`` kernel was measured
as the alternative and was 2-3x slower on 2 threads (docs/benchmarks/ds-optim.md), so it is not shipped.

The low-precision copy (bf16/fp16 weights that the model computes with) is written by one multi-tensor copy
right after the update. Interleaving the copy chunk by chunk (to keep each chunk in cache) was measured and
was much slower: each call of the fused kernel has a large fixed cost on CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

__all__ = ["CPUAdam"]

# A step of +inf makes both bias corrections (1 - beta**step) exactly 1, which is Adam without them.
_NO_BIAS_CORRECTION_STEP = float("inf")


class CPUAdam(torch.optim.Optimizer):
    """Adam (``adamw_mode=False``: L2 added to the gradient) or AdamW (decoupled decay, the default).

    Args:
        params: fp32 parameters (on the CPU for offload; any device torch's fused Adam supports works).
        lr, betas, eps, weight_decay: as in ``torch.optim.AdamW``.
        bias_correction: divide the moments by ``1 - beta**t`` (DeepSpeed's default True).
        adamw_mode: decoupled weight decay (True) or L2 regularisation (False).

    ``step(lowp_params=...)`` also writes each updated parameter into the matching low-precision tensor.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        adamw_mode: bool = True,
        amsgrad: bool = False,
    ) -> None:
        if amsgrad:
            raise ValueError(
                "CPUAdam does not support amsgrad; use torch.optim.Adam with amsgrad=True instead"
            )
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(
                f"lr, eps and weight_decay must be non-negative, got {lr}, {eps}, {weight_decay}"
            )
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            adamw_mode=adamw_mode,
        )
        super().__init__(params, defaults)

    def _group_state(self, group: dict[str, Any]) -> tuple[list[torch.Tensor], ...]:
        params, grads, exp_avgs, exp_avg_sqs = [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("CPUAdam does not support sparse gradients")
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
        return params, grads, exp_avgs, exp_avg_sqs

    @torch.no_grad()
    def step(
        self,
        closure: Callable[[], float] | None = None,
        lowp_params: Sequence[torch.Tensor] | None = None,
    ) -> float | None:
        """One update of every parameter with a gradient.

        ``lowp_params``: one tensor per parameter of the optimizer (all groups, in order, same shapes),
        receiving the updated values cast to its dtype (e.g. bf16/fp16 model weights).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        lowp_of = self._match_lowp(lowp_params)
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs = self._group_state(group)
            for p in params:
                self.state[p]["step"] += 1
            self._kernel(group, params, grads, exp_avgs, exp_avg_sqs, [self.state[p]["step"] for p in params])
            pairs = [(lowp_of[id(p)], p) for p in params if id(p) in lowp_of]
            if pairs:
                torch._foreach_copy_([q for q, _ in pairs], [p for _, p in pairs])
        return loss

    def _match_lowp(self, lowp_params: Sequence[torch.Tensor] | None) -> dict[int, torch.Tensor]:
        if lowp_params is None:
            return {}
        all_params = [p for g in self.param_groups for p in g["params"]]
        if len(lowp_params) != len(all_params):
            raise ValueError(
                f"lowp_params has {len(lowp_params)} tensors, the optimizer has {len(all_params)}"
            )
        for p, q in zip(all_params, lowp_params):
            if q.shape != p.shape:
                raise ValueError(
                    f"lowp_params shape {tuple(q.shape)} does not match parameter {tuple(p.shape)}"
                )
        return {id(p): q for p, q in zip(all_params, lowp_params)}

    @staticmethod
    def _kernel(
        group: dict[str, Any],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        exp_avgs: list[torch.Tensor],
        exp_avg_sqs: list[torch.Tensor],
        steps: list[torch.Tensor],
    ) -> None:
        if not params:
            return
        if not group["bias_correction"]:
            steps = [torch.full_like(s, _NO_BIAS_CORRECTION_STEP) for s in steps]
        kernel = torch._fused_adamw_ if group["adamw_mode"] else torch._fused_adam_
        beta1, beta2 = group["betas"]
        kernel(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            amsgrad=False,
            maximize=False,
        )
