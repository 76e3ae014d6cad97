"""CPUAdam: Adam/AdamW for ZeRO offload on fp32 master weights, with an optional low-precision copy.

Without a low-precision copy the update runs on torch's fused Adam kernel (``torch._fused_adam_``/
``torch._fused_adamw_``), which ships compiled with torch and was the fastest update alone here
(tools/bench/bench_optim.py; no record kept, the notes are in git: git show af730fc:docs/benchmarks/ds-optim.md).

With a copy (``step(lowp_params=...)``, the bf16/fp16 weights the model computes with) and numba installed
(``pip install 'ds-optim[fast]'``), a Numba kernel updates weights and moments and writes the copy in the
same pass over memory (``_numba_adam``; JIT-compiled by numba's bundled LLVM, so no compiler at install).
Without numba, or for tensors it does not take (not CPU, not contiguous fp32), the fused kernel runs and
one multi-tensor copy follows: a second pass over the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import cache
from types import ModuleType
from typing import Any

import torch

__all__ = ["CPUAdam"]

# A step of +inf makes both bias corrections (1 - beta**step) exactly 1, which is Adam without them.
_NO_BIAS_CORRECTION_STEP = float("inf")


@cache
def _load_numba_adam() -> ModuleType | None:
    """The one-pass kernel module, or None without numba (the torch two-pass path is used then)."""
    try:
        from ds_optim import _numba_adam
    except ImportError:
        return None
    return _numba_adam


def _one_pass_ok(tensors: list[torch.Tensor], lowp: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> bool:
    return (
        lowp.dtype in dtypes
        and all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)
        and lowp.device.type == "cpu"
        and lowp.is_contiguous()
    )


def tensor_step(state: dict[str, Any]) -> None:
    """Make a parameter's ``step`` the float32 tensor the update takes, when a load gave a number (DeepSpeed's
    FusedAdam saves an int: an imported DeepSpeed checkpoint), as torch's Adam does when it loads one."""
    step = state.get("step")
    if step is not None and not torch.is_tensor(step):
        state["step"] = torch.tensor(float(step), dtype=torch.float32)


class CPUAdam(torch.optim.Optimizer):
    """Adam (``adamw_mode=False``: L2 added to the gradient) or AdamW (decoupled decay, the default).

    Args:
        params: fp32 parameters (on the CPU for offload; any device torch's fused Adam supports works).
        lr, betas, eps, weight_decay: as in ``torch.optim.AdamW``.
        bias_correction: divide the moments by ``1 - beta**t`` (DeepSpeed's default True).
        adamw_mode: decoupled weight decay (True) or L2 regularisation (False).
        fp32_optimizer_states: keep the moments in fp32 whatever the parameters' dtype (the default; a
            bf16/fp16 parameter is then updated in fp32 and rounded once), or in the parameters' own
            dtype (False: half the state memory for bf16 parameters, at lower state precision).

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
        fp32_optimizer_states: bool = True,
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
        self.fp32_optimizer_states = fp32_optimizer_states

    def _group_state(self, group: dict[str, Any]) -> tuple[list[torch.Tensor], ...]:
        params, grads, exp_avgs, exp_avg_sqs = [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("CPUAdam does not support sparse gradients")
            state = self.state[p]
            if not state:
                state.update(self._new_state(p))
            tensor_step(state)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
        return params, grads, exp_avgs, exp_avg_sqs

    def _new_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        dtype = torch.float32 if self.fp32_optimizer_states else p.dtype
        return {
            "step": torch.zeros((), dtype=torch.float32, device=p.device),
            "exp_avg": torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format),
        }

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
            if lowp_of and self._one_pass(group, params, grads, exp_avgs, exp_avg_sqs, lowp_of):
                continue
            self._update(group, params, grads, exp_avgs, exp_avg_sqs, [self.state[p]["step"] for p in params])
            pairs = [(lowp_of[id(p)], p) for p in params if id(p) in lowp_of]
            if pairs:
                torch._foreach_copy_([q for q, _ in pairs], [p for _, p in pairs])
        return loss

    def _one_pass(
        self,
        group: dict[str, Any],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        exp_avgs: list[torch.Tensor],
        exp_avg_sqs: list[torch.Tensor],
        lowp_of: dict[int, torch.Tensor],
    ) -> bool:
        """Update and copy ``group`` with the Numba kernel; False (nothing done) when it cannot."""
        numba_adam = _load_numba_adam()
        if numba_adam is None:
            return False
        rows = list(zip(params, grads, exp_avgs, exp_avg_sqs))
        if not all(_one_pass_ok(list(row), lowp_of[id(row[0])], numba_adam.DTYPES) for row in rows):
            return False
        for p, g, m, v in rows:
            numba_adam.adam_step_with_copy(
                p,
                g,
                m,
                v,
                lowp_of[id(p)],
                step=self.state[p]["step"].item(),
                lr=group["lr"],
                betas=group["betas"],
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                adamw_mode=group["adamw_mode"],
                bias_correction=group["bias_correction"],
            )
        return True

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

    @classmethod
    def _update(
        cls,
        group: dict[str, Any],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        exp_avgs: list[torch.Tensor],
        exp_avg_sqs: list[torch.Tensor],
        steps: list[torch.Tensor],
    ) -> None:
        """The fused kernel on every row; a parameter whose moments are fp32 but itself is not (bf16/fp16
        with ``fp32_optimizer_states``) is updated in an fp32 copy and rounded back once."""
        rows = list(zip(params, grads, exp_avgs, exp_avg_sqs, steps))
        same = [r for r in rows if r[0].dtype == r[2].dtype]
        upcast = [r for r in rows if r[0].dtype != r[2].dtype]
        if same:
            cls._kernel(group, *(list(col) for col in zip(*same)))
        if upcast:
            p32 = [r[0].float() for r in upcast]
            g32 = [r[1].float() for r in upcast]
            cls._kernel(group, p32, g32, *(list(col) for col in list(zip(*upcast))[2:]))
            torch._foreach_copy_([r[0] for r in upcast], p32)

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
