"""Flat fp32 master buffers for one optimizer param group, and the inner optimizer's view of them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["FlatGroup", "build_flat_group"]


@dataclass
class FlatGroup:
    """One param group's flat space: the model's trainable params in group order, no padding.

    ``masters[i]`` is what the inner optimizer updates: an fp32 view of ``flat_master`` (or, in
    alias mode, the model parameter itself, re-pointed into ``flat_master``). ``grad_views[i]`` is
    the matching slice of ``flat_grad`` (``None`` in alias mode, where the model's grads are used, and
    between steps when the owner released the buffer with :meth:`release_grads`).
    """

    model_params: list[torch.nn.Parameter]
    masters: list[torch.Tensor]
    names: list[str]
    offsets: list[int]
    flat_master: torch.Tensor
    flat_grad: torch.Tensor | None
    grad_views: list[torch.Tensor] | None
    # the model's params re-pointed into one low-precision buffer (when they share a dtype), so the
    # copy-back after a step is one contiguous copy instead of one per parameter
    flat_model: torch.Tensor | None = None
    # per param: did a micro-step accumulate a gradient into flat_grad since the last zero_grad
    accumulated: list[bool] = field(default_factory=list)
    # the model's params are the masters (fp32 model, or no master weights): no fp32 copies at all
    aliased: bool = False

    @property
    def numel(self) -> int:
        return self.flat_master.numel()

    def allocate_grads(self) -> None:
        """Create the fp32 gradient buffer and its per-parameter views, unless they exist.

        The buffer is uninitialised: the optimizer writes every view it reads (a parameter without a
        gradient has no master grad and is not stepped).
        """
        if self.flat_grad is None and not self.aliased:
            self.flat_grad = torch.empty_like(self.flat_master)
            self.grad_views = _views(self.flat_grad, self.offsets, self.model_params)

    def release_grads(self) -> None:
        """Free the fp32 gradient buffer: between steps nothing reads it (the model's grads hold the
        next step's gradients until :meth:`allocate_grads` copies them in)."""
        self.flat_grad = None
        self.grad_views = None
        for m in self.masters:
            m.grad = None


def _views(flat: torch.Tensor, offsets: list[int], params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Per-parameter views of one flat buffer, shaped like the parameters."""
    return [flat[o : o + p.numel()].view_as(p) for o, p in zip(offsets, params)]


def _single_device(params: list[torch.nn.Parameter], names: list[str]) -> torch.device:
    device = params[0].device
    for p, name in zip(params, names):
        if p.device != device:
            raise ValueError(
                f"parameter {name} is on {p.device} but {names[0]} is on {device}: every parameter of "
                "an optimizer param group must be on one device; move the model with .to(device) first"
            )
        if not p.is_floating_point():
            raise TypeError(f"parameter {name} has dtype {p.dtype}; only floating-point parameters can train")
    return device


def build_flat_group(
    params: list[torch.nn.Parameter], names: list[str], *, alias: bool, master_dtype: torch.dtype
) -> FlatGroup:
    """Copy ``params`` into one flat buffer and make the per-parameter views the optimizer will see.

    With ``alias`` the model parameters themselves are re-pointed into the flat buffer (their dtype
    must be ``master_dtype``), so no copy is ever needed between model and master weights.
    """
    device = _single_device(params, names)
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += p.numel()
    flat_master = torch.empty(total, dtype=master_dtype, device=device)
    views = _views(flat_master, offsets, params)
    with torch.no_grad():
        torch._foreach_copy_(views, [p.detach() for p in params])
    if alias:
        for p, v, name in zip(params, views, names):
            if p.dtype != master_dtype:
                raise TypeError(
                    f"parameter {name} has dtype {p.dtype} but the model trains in {master_dtype}: "
                    "cast the whole model to one dtype, or keep fp32 master weights (master_weights=True)"
                )
            p.data = v
        return FlatGroup(list(params), list(params), names, offsets, flat_master, None, None, aliased=True)
    flat_grad = torch.zeros(total, dtype=master_dtype, device=device)
    grad_views = _views(flat_grad, offsets, params)
    masters = [torch.nn.Parameter(v) for v in views]  # shares storage with flat_master
    for m, g in zip(masters, grad_views):
        m.grad = g
    return FlatGroup(
        list(params),
        masters,
        names,
        offsets,
        flat_master,
        flat_grad,
        grad_views,
        flat_model=_flatten_model_params(params, offsets, total),
        accumulated=[False] * len(params),
    )


def _flatten_model_params(
    params: list[torch.nn.Parameter], offsets: list[int], total: int
) -> torch.Tensor | None:
    """Re-point same-dtype model params into one flat buffer; ``None`` when their dtypes differ."""
    dtype = params[0].dtype
    if any(p.dtype != dtype for p in params):
        return None
    flat = torch.empty(total, dtype=dtype, device=params[0].device)
    for p, o in zip(params, offsets):
        view = flat[o : o + p.numel()].view_as(p)
        view.copy_(p.detach())
        p.data = view
    return flat
