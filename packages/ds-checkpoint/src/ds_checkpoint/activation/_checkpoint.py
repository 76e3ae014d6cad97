"""``checkpoint(function, *args)``: keep only the inputs in forward, recompute the rest in backward."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._partition import gather_full, take_partition
from ._profile import ActivationProfile, synchronize_device, timed
from ._rng import RNGSnapshot
from ._state import ActivationCheckpointingSettings, model_parallel_info, runtime

_NO_MP = (0, 1, None)
_GRAD_ERROR = "Checkpointing is not compatible with .grad(), please use .backward() if possible"


@dataclass(frozen=True)
class _SavedArg:
    """How to rebuild one positional argument in backward.

    ``kind``: "object" (non-tensor, kept as is), "tensor" (kept whole, maybe on CPU) or
    "partition" (this rank's slice; the rest comes from the model-parallel group).
    """

    kind: str
    value: Any = None  # the argument itself for "object"
    slot: int = -1  # index into ctx.saved_tensors
    shape: torch.Size | None = None
    device: torch.device | None = None
    requires_grad: bool = False


def _is_activation(item: Any) -> bool:
    # Integer tensors (token ids, masks) are never partitioned: they are small and not differentiable.
    return torch.is_tensor(item) and item.is_floating_point()


def _save_args(
    ctx: Any, args: tuple[Any, ...], settings: ActivationCheckpointingSettings, mp: tuple[int, int, Any]
) -> list[_SavedArg]:
    """Decide what each argument keeps for backward and hand the tensors to ``save_for_backward``."""
    pool = runtime().pool
    mp_rank, mp_size, _ = mp
    to_save: list[torch.Tensor] = []
    recipe: list[_SavedArg] = []
    position = 0  # index among partitioned arguments: the contiguous pool's key, as DeepSpeed's
    for arg in args:
        if not torch.is_tensor(arg):
            recipe.append(_SavedArg("object", value=arg))
            continue
        kind = "tensor"
        payload = arg
        if settings.partition_activations and _is_activation(arg):
            kind = "partition"
            payload = take_partition(arg, mp_rank, mp_size)
            if pool is not None:
                payload = pool.store(position, payload)
            position += 1
        if settings.cpu_checkpointing and _is_activation(arg) and payload.device.type != "cpu":
            payload = payload.detach().to("cpu")
        recipe.append(
            _SavedArg(
                kind, slot=len(to_save), shape=arg.shape, device=arg.device, requires_grad=arg.requires_grad
            )
        )
        to_save.append(payload)
    ctx.save_for_backward(*to_save)
    return recipe


def _restore_args(ctx: Any) -> list[Any]:
    """Inputs for the recomputation: detached, on their original device, whole again."""
    saved = ctx.saved_tensors
    _, mp_size, group = ctx.model_parallel
    inputs: list[Any] = []
    for item in ctx.recipe:
        if item.kind == "object":
            inputs.append(item.value)
            continue
        tensor = saved[item.slot].to(item.device, non_blocking=True)
        if item.kind == "partition":
            tensor = gather_full(tensor, item.shape, mp_size, group)
        tensor = tensor.detach()
        tensor.requires_grad_(item.requires_grad)
        inputs.append(tensor)
    return inputs


def _as_tuple(outputs: Any) -> tuple[Any, ...]:
    return outputs if isinstance(outputs, tuple) else (outputs,)


class _CheckpointFunction(torch.autograd.Function):
    """The autograd node of one ``checkpoint()`` call (reentrant: backward runs its own backward)."""

    @staticmethod
    def forward(ctx: Any, run_function: Callable[..., Any], _anchor: Any, *args: Any) -> Any:
        state = runtime()
        settings = state.settings
        profile = state.profile if settings.profile else None
        if settings.synchronize_checkpoint_boundary:
            synchronize_device()
        with timed(profile, "forward"):
            ctx.run_function = run_function
            ctx.settings = settings
            # The mpu is only consulted when partitioning: the default path skips its six lookups.
            ctx.model_parallel = model_parallel_info(state.mpu) if settings.partition_activations else _NO_MP
            # Saved before running: the function may modify its inputs in place.
            ctx.recipe = _save_args(ctx, args, settings, ctx.model_parallel)
            ctx.rng = RNGSnapshot.capture()
            with torch.no_grad():
                outputs = run_function(*args)
        if settings.synchronize_checkpoint_boundary:
            synchronize_device()
        if not isinstance(outputs, (torch.Tensor, tuple)):
            raise TypeError(
                f"checkpoint(): the function must return a tensor or a tuple, got {type(outputs).__name__}"
            )
        non_diff = [o for o in _as_tuple(outputs) if torch.is_tensor(o) and not o.is_floating_point()]
        ctx.mark_non_differentiable(*non_diff)
        # Unused outputs then get None instead of a zero tensor, and are skipped in backward.
        ctx.set_materialize_grads(False)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> tuple[Any, ...]:
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(_GRAD_ERROR)
        state = runtime()
        settings: ActivationCheckpointingSettings = ctx.settings
        profile = state.profile if settings.profile else None
        if settings.synchronize_checkpoint_boundary:
            synchronize_device()
        if state.pool is not None:
            state.pool.release()  # this step's forward is over: the next forward starts from slot 0
        inputs = _restore_args(ctx)
        outputs = _recompute(ctx, inputs, profile)
        pairs = [
            (out, grad)
            for out, grad in zip(_as_tuple(outputs), grad_outputs)
            if torch.is_tensor(out) and out.requires_grad and grad is not None
        ]
        with timed(profile, "backward"):
            if pairs:
                torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])
        if settings.synchronize_checkpoint_boundary:
            synchronize_device()
        grads = tuple(inp.grad if torch.is_tensor(inp) and inp.requires_grad else None for inp in inputs)
        return (None, None, *grads)


def _recompute(ctx: Any, inputs: list[Any], profile: ActivationProfile | None) -> Any:
    """Re-run the function with grad, replaying the forward's RNG states, then restore the current ones."""
    current = RNGSnapshot.capture()
    ctx.rng.restore()
    try:
        with timed(profile, "recompute"), torch.enable_grad():
            return ctx.run_function(*inputs)
    finally:
        current.restore()


def checkpoint(function: Callable[..., Any], *args: Any) -> Any:
    """Run ``function(*args)`` without keeping its intermediate activations; recompute them in backward.

    Only the inputs are kept (partitioned across the model-parallel group, on the CPU, in
    contiguous buffers, as configured by ``configure()``); the RNG states are replayed so dropout
    masks in the recomputation equal the forward's. ``args`` may hold non-tensors; ``function`` may
    return a tensor or a tuple (integer outputs are non-differentiable). Gradients reach the
    parameters ``function`` uses even when no input requires grad. Use ``loss.backward()``:
    ``torch.autograd.grad`` through a checkpoint raises ``RuntimeError``. With gradients disabled
    this is a plain call.
    """
    if not torch.is_grad_enabled():
        return function(*args)
    anchor = None
    if not any(torch.is_tensor(a) and a.requires_grad for a in args):
        # A reentrant node with no grad-requiring input would be cut from the graph and the
        # function's parameters would silently get no gradient; this empty leaf keeps it in.
        anchor = torch.empty(0, requires_grad=True)
    return _CheckpointFunction.apply(function, anchor, *args)
