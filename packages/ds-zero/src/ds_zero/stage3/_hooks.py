"""When stage 3 gathers and releases parameters: module forward hooks, output hooks, gradient hooks.

* forward: a module's own parameters (``recurse=False``) are gathered by its forward pre-hook and
  released by its forward hook, unless another module still in its forward uses them (tied weights).
* backward: a hook on each output of the module gathers them again when the gradient reaches the
  module (autograd saved the parameter itself, whose data was released). A parameter is released
  when its gradient has been accumulated: every op that used it has run its backward by then.
  Activation checkpointing's recomputation runs the forward hooks again, so it re-gathers too.
* a frozen parameter (its own partition, ``_frozen``) gets no gradient: it is released once the gradient of
  its module's inputs has been computed (a hook on each input that requires grad, registered by the
  forward pre-hook), which needs the module's backward done; without such an input it waits for the end.
* the end of each backward releases whatever is left (parameters that got no gradient).
* a parameter a module's forward returns (DeepSpeed's "dangling" external parameter: the caller uses
  it, not the module that owns it) stays gathered until the whole model's forward ends, and is gathered
  again when the backward starts, as DeepSpeed 0.19.8 does by registering it on the calling module.
* a leaf module (``_leaf``) is hooked as one module owning every parameter inside it: one gather for its
  forward, one for its backward. Its output carries every trainable parameter inside it into autograd
  (``_TouchParams``, a zero gradient for the experts this rank did not run), so each rank's gradients
  of the block arrive in its backward and the reduction buckets launch at the same point on every rank.

Every fetch and release goes through ``FetchSchedule`` (``_fetch``), which may gather the next
modules' parameters early and keep a released one whole when it is used again soon.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from .._weak_hook import weak_post_accumulate_grad_hook
from ._fetch import FetchSchedule
from ._leaf import PARAM_FLAG, walk_hooked_modules
from ._partition import ParamSlot, PartitionedParams

__all__ = ["GatherHooks", "register_external_parameter", "unregister_external_parameter"]


def register_external_parameter(module: nn.Module, parameter: nn.Parameter) -> None:
    """Gather ``parameter`` for ``module``'s forward and backward too (DeepSpeed's name and meaning).

    For a parameter that ``module``'s forward uses although another module registers it (a parent
    computing ``x @ self.embedding.weight.t()``). Call it before the stage-3 optimizer is built. They are kept
    where DeepSpeed keeps them: ``module._external_params``, ``{id(parameter): parameter}``.
    """
    if not isinstance(parameter, nn.Parameter):
        raise RuntimeError("Parameter is not a torch.nn.Parameter")
    module.__dict__.setdefault("_external_params", {})[id(parameter)] = parameter


def unregister_external_parameter(module: nn.Module, parameter: nn.Parameter) -> None:
    """Undo ``register_external_parameter`` (DeepSpeed's name, errors and meaning)."""
    if not isinstance(parameter, nn.Parameter):
        raise RuntimeError("Parameter is not a torch.nn.Parameter")
    external = module.__dict__.get("_external_params", {})
    if id(parameter) not in external:
        raise RuntimeError("Parameter is not a registered external parameter of module.")
    del external[id(parameter)]


class GatherHooks:
    """Installs the hooks on every submodule that owns managed parameters; ``remove()`` takes them off.

    ``on_grad(param)`` is called as autograd accumulates each parameter's full gradient into ``.grad``;
    the parameter's ``.grad`` is cleared afterwards (the gradient reducer keeps what it needs). Fetches and
    releases go through ``schedule`` (prefetch, reuse, live bound).
    """

    def __init__(
        self,
        module: nn.Module,
        params: PartitionedParams,
        on_grad: Callable[[nn.Parameter], None],
        schedule: FetchSchedule,
    ) -> None:
        self.params = params
        self.schedule = schedule
        self.on_grad = on_grad
        self._handles: list[Any] = []
        self._returned: list[ParamSlot] = []  # parameters some module's forward returned (see the docstring)
        for m, leaf in walk_hooked_modules(module):
            # its own parameters, and those it uses but another module registers (register_external_parameter);
            # a leaf's are those of every module inside it
            inside = list(m.modules()) if leaf else [m]
            slots = params.slots_of(
                [
                    p
                    for sub in inside
                    for p in (*sub._parameters.values(), *sub.__dict__.get("_external_params", {}).values())
                ]
            )
            if not slots:
                continue
            if leaf:
                for s in slots:
                    setattr(s.param, PARAM_FLAG, m)
            self._handles.append(m.register_forward_pre_hook(partial(self._pre_forward, slots)))
            self._handles.append(m.register_forward_hook(partial(self._post_forward, slots, leaf)))
        for s in params.slots.values():
            if s.param.requires_grad:
                self._handles.append(weak_post_accumulate_grad_hook(s.param, self._grad_ready))
        self._handles.append(module.register_forward_hook(self._model_post_forward))

    def _pre_forward(self, slots: list[ParamSlot], module: nn.Module, inputs: Any) -> None:
        for s in slots:
            s.fwd_users += 1
        self.schedule.fetch(slots)
        frozen = [s for s in slots if s.frozen is not None]
        if frozen and torch.is_grad_enabled():
            for t in _tensors(inputs):
                if t.requires_grad and not isinstance(t, nn.Parameter):
                    handle: list[Any] = []
                    handle.append(t.register_hook(partial(self._inputs_done, frozen, handle)))

    def _inputs_done(self, slots: list[ParamSlot], handle: list[Any], grad: torch.Tensor) -> None:
        """The gradient of a module's input is complete: its frozen parameters can go (see the docstring)."""
        handle.pop().remove()
        for s in slots:
            s.bwd_hold = False
        self.schedule.release(slots)

    def _post_forward(
        self, slots: list[ParamSlot], leaf: bool, module: nn.Module, inputs: Any, output: Any
    ) -> Any:
        for s in slots:
            s.fwd_users -= 1
        if leaf and torch.is_grad_enabled():
            output = _touch_params(output, [s.param for s in slots if s.param.requires_grad])
        outputs = _tensors(output)
        self._hold_returned(outputs)
        if torch.is_grad_enabled():
            for t in outputs:
                if t.requires_grad and not isinstance(t, nn.Parameter):
                    t.register_hook(partial(self._pre_backward, slots))
        self.schedule.release(slots)
        return output if leaf else None

    def _hold_returned(self, outputs: list[torch.Tensor]) -> None:
        """Keep each managed parameter among a module's outputs gathered until the model's forward ends."""
        for t in outputs:
            slot = self.params.slots.get(id(t)) if isinstance(t, nn.Parameter) else None
            if slot is not None and not any(slot is s for s in self._returned):
                slot.fwd_users += 1
                self._returned.append(slot)

    def _model_post_forward(self, module: nn.Module, inputs: Any, output: Any) -> None:
        """The whole forward is over: release the returned parameters, and have the backward gather them."""
        returned, self._returned = self._returned, []
        if not returned:
            return
        for s in returned:
            s.fwd_users -= 1
        if torch.is_grad_enabled():
            for t in _tensors(output):
                if t.requires_grad and not isinstance(t, nn.Parameter):
                    t.register_hook(partial(self._pre_backward, returned))
        self.schedule.release(returned)

    def _pre_backward(self, slots: list[ParamSlot], grad: torch.Tensor) -> None:
        for s in slots:
            s.bwd_hold = True
        self.schedule.fetch(slots)

    def _grad_ready(self, param: nn.Parameter) -> None:
        slot = self.params.slot(param)
        if param.grad is not None:
            self.on_grad(param)
        param.grad = None
        slot.bwd_hold = False
        self.schedule.release([slot])

    def end_backward(self) -> None:
        """Release every parameter still held for a backward that is over.

        Forward counts are reset too: non-reentrant activation checkpointing stops its recomputation
        early, inside a module's forward, so that module's forward hook never runs.
        """
        self.schedule.end_micro_step()
        self._returned = []
        for s in self.params.slots.values():
            s.bwd_hold, s.fwd_users = False, 0
        self.params.release(self.params.slots.values())

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def _tensors(output: Any) -> list[torch.Tensor]:
    """The tensors in a module's output (a tensor, or tuples, lists and dicts of them)."""
    if torch.is_tensor(output):
        return [output]
    if isinstance(output, tuple | list):
        return [t for o in output for t in _tensors(o)]
    if isinstance(output, dict):
        return [t for o in output.values() for t in _tensors(o)]
    return []


class _TouchParams(torch.autograd.Function):
    """Identity on ``out``; a zero gradient for each parameter (see the module docstring: leaf modules)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, *params: nn.Parameter) -> torch.Tensor:
        ctx.shapes = [(p.shape, p.dtype, p.device) for p in params]
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (
            grad,
            *(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.shapes),
        )


def _touch_params(output: Any, params: list[nn.Parameter]) -> Any:
    """``output`` with its first tensor that requires grad passed through ``_TouchParams``."""
    if not params:
        return output
    if torch.is_tensor(output):
        return (
            _TouchParams.apply(output, *params)
            if output.requires_grad and output.is_floating_point()
            else output
        )
    if isinstance(output, tuple | list):
        items = list(output)
        for i, o in enumerate(items):
            touched = _touch_params(o, params)
            if touched is not o:
                items[i] = touched
                return type(output)(items) if not hasattr(output, "_fields") else type(output)(*items)
        return output
    return output
