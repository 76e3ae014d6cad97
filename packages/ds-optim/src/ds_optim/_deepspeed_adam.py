"""DeepSpeed's Adam classes by name: ``FusedAdam`` and ``DeepSpeedCPUAdam``, both :class:`CPUAdam` underneath.

``CPUAdam`` already is DeepSpeed's Adam (AdamW or L2 mode, optional bias correction) and runs on any
device torch's fused Adam supports, so these classes translate DeepSpeed's constructor arguments and add
the DeepSpeed-only methods (``step_subgroup``, ``rollback_subgroup``). The config's ``Adam``/``AdamW``
builds them (``build_optimizer``), so code that checks ``isinstance(opt, FusedAdam)`` sees what it
would under DeepSpeed; ``deepspeed.ops.adam`` exports these same classes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ds_optim._cpu_adam import CPUAdam, tensor_step

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
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            adamw_mode=adam_w_mode,
        )
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none


class DeepSpeedCPUAdam(CPUAdam):
    """DeepSpeed's ``DeepSpeedCPUAdam`` (ZeRO-Offload's optimizer).

    ``fp32_optimizer_states=False`` keeps the moments in the parameters' dtype, as in DeepSpeed.
    ``step_subgroup(i)`` / ``rollback_subgroup(i)`` step, and undo a step of, the one parameter that has a
    gradient (ZeRO-3 offload's flat partition of sub-group ``i``) with its state kept under the key ``i``.
    """

    optimizer_id = 0

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
        super().__init__(
            model_params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            adamw_mode=adamw_mode,
            amsgrad=amsgrad,
            fp32_optimizer_states=fp32_optimizer_states,
        )
        self.adam_w_mode = adamw_mode
        self.opt_id = DeepSpeedCPUAdam.optimizer_id
        DeepSpeedCPUAdam.optimizer_id += 1

    def _subgroup_param(self, subgroup_id: int) -> tuple[dict[str, Any], torch.Tensor] | None:
        """(group, parameter) of the one parameter with a gradient; None when no parameter has one."""
        found = [(g, p) for g in self.param_groups for p in g["params"] if p.grad is not None]
        if len(found) > 1:
            raise ValueError(
                f"DeepSpeedCPUAdam sub-group {subgroup_id}: {len(found)} parameters have gradients, but a "
                "sub-group step keeps one state under its id and needs exactly one parameter (ZeRO-3 offload "
                "puts one flat partition in param_groups per sub-group); use step() for several parameters"
            )
        return found[0] if found else None

    @torch.no_grad()
    def step_subgroup(self, subgroup_id: int, closure: Callable[[], float] | None = None) -> float | None:
        """One update of the parameter with a gradient, its moments kept in ``self.state[subgroup_id]``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found = self._subgroup_param(subgroup_id)
        if found is None:
            return loss
        group, p = found
        state = self.state[subgroup_id]
        if not state:
            state.update(self._new_state(p))
        tensor_step(state)
        state["step"] += 1
        self._update(group, [p], [p.grad], [state["exp_avg"]], [state["exp_avg_sq"]], [state["step"]])
        return loss

    @torch.no_grad()
    def rollback_subgroup(
        self, sub_group_id: int, closure: Callable[[], float] | None = None
    ) -> float | None:
        """Undo the last ``step_subgroup(sub_group_id)``: parameter and moments return to their values
        before it (to fp32 rounding), given the same gradient still in ``.grad``; the step count drops by 1.

        The inverse follows the mode the step used (AdamW's decoupled decay or Adam's L2 term, with or
        without bias correction).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        state = self.state.get(sub_group_id) if sub_group_id in self.state else None
        if not state:
            raise RuntimeError(
                f"Cannot rollback optimizer state for sub_group_id {sub_group_id} as it has not been initialized."
            )
        if int(state["step"]) <= 0:
            raise RuntimeError(
                f"Cannot rollback sub_group_id {sub_group_id}: step count is {int(state['step'])}"
            )
        found = self._subgroup_param(sub_group_id)
        if found is None:
            return loss
        group, p = found
        _undo_adam_step(group, p, p.grad, state["exp_avg"], state["exp_avg_sq"], int(state["step"]))
        state["step"] -= 1
        return loss


def _undo_adam_step(
    group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int
) -> None:
    """Invert step number ``step`` of Adam/AdamW in place (computed in fp32)."""
    beta1, beta2 = group["betas"]
    if beta1 == 0 or beta2 == 0:
        raise RuntimeError(
            "Cannot rollback an Adam step with beta1 or beta2 equal to 0: the moments are lost"
        )
    lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
    bc1 = 1 - beta1**step if group["bias_correction"] else 1.0
    bc2 = 1 - beta2**step if group["bias_correction"] else 1.0
    m32, v32, g32 = m.float(), v.float(), grad.float()
    before = p.float() + lr * (m32 / bc1) / ((v32 / bc2).sqrt() + eps)
    if group["adamw_mode"]:
        before /= 1 - lr * wd  # decoupled decay scaled the parameter before the update
        g_eff = g32
    else:
        g_eff = g32 + wd * before  # L2: the decay entered the gradient the moments saw
    p.copy_(before)
    m.copy_((m32 - (1 - beta1) * g_eff) / beta1)
    v.copy_((v32 - (1 - beta2) * g_eff * g_eff) / beta2)
