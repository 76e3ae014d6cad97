"""DeepSpeed's ``deepspeed.runtime.zero.utils``: the small helpers ZeRO code around DeepSpeed imports.

``is_zero_param`` holds for a stage-3 parameter (it carries ``ds_id``, as ds_zero's do); ``apply_to_tensors_only``
maps a function over the tensors of nested tuples, lists, named tuples and dicts; the rank checks
(``assert_ints_same_as_other_ranks``, ...) are broadcasts from rank 0 over the default group, raising
``RuntimeError`` with DeepSpeed's words on a disagreement. ``ZERO_SUPPORTED_OPTIMIZERS`` lists the optimizer
classes ZeRO takes without ``zero_allow_untested_optimizer``. No mechanism lives here.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from deepspeed.accelerator.real_accelerator import get_accelerator
from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

logger = logging.getLogger("deepspeed")

__all__ = [
    "ZERO_SUPPORTED_OPTIMIZERS",
    "ZeRORuntimeException",
    "apply_to_tensors_only",
    "assert_ints_same_as_other_ranks",
    "assert_lst_len_same_as_other_ranks",
    "defragment",
    "get_lst_from_rank0",
    "get_mapping_to_flat_buffer",
    "get_norm_dtype",
    "is_builtin_type",
    "is_zero_param",
    "is_zero_supported_optimizer",
    "isinstance_namedtuple",
    "warned",
]

warned = False  # apply_to_tensors_only warns once about a non-tensor, non-builtin value


class ZeRORuntimeException(Exception):
    """DeepSpeed's error class for a ZeRO misuse found at run time."""


ZERO_SUPPORTED_OPTIMIZERS: list[type] = [
    torch.optim.Adam,
    torch.optim.AdamW,
    FusedAdam,
    DeepSpeedCPUAdam,
    torch.optim.Adagrad,
    DeepSpeedCPUAdagrad,
    DeepSpeedCPULion,
    FusedLion,
]


def get_norm_dtype() -> torch.dtype:
    """The dtype gradient norms accumulate in: float64 where the device has it, else float32."""
    return torch.double if get_accelerator().is_fp64_supported() else torch.float


def is_zero_supported_optimizer(optimizer: Any) -> bool:
    """Whether ``type(optimizer)`` is one ZeRO takes without ``zero_allow_untested_optimizer``."""
    return type(optimizer) in ZERO_SUPPORTED_OPTIMIZERS


def _device() -> torch.device:
    return torch.device(get_accelerator().current_device_name())


def assert_lst_len_same_as_other_ranks(lst: list[int]) -> None:
    """Raise on a rank whose ``len(lst)`` differs from rank 0's (collective)."""
    length = torch.tensor(len(lst) if dist.get_rank() == 0 else -1, dtype=torch.long, device=_device())
    dist.broadcast(length, src=0)
    if int(length) != len(lst):
        raise RuntimeError(
            f"Detected a disagreement on list length between rank0 and rank{dist.get_rank()}: "
            f"\n rank0: {int(length)} \n rank{dist.get_rank()}: {len(lst)}"
        )


def get_lst_from_rank0(lst: list[int]) -> list[int]:
    """Rank 0's ``lst`` on every rank (collective; every rank passes a list of the same length)."""
    values = torch.tensor(
        lst if dist.get_rank() == 0 else [-1] * len(lst), dtype=torch.long, device=_device()
    )
    dist.broadcast(values, src=0)
    return [int(v) for v in values.cpu()]


def assert_ints_same_as_other_ranks(ints: list[int]) -> None:
    """Raise on a rank whose list of ints differs from rank 0's (collective)."""
    assert_lst_len_same_as_other_ranks(ints)
    rank0 = get_lst_from_rank0(ints)
    if ints != rank0:
        raise RuntimeError(
            f"Detected a disagreement on list contents between rank0 and rank{dist.get_rank()}: "
            f"\n list length: {len(ints)}\n rank0: {rank0} \n rank{dist.get_rank()}: {ints}"
        )


def is_builtin_type(obj: Any) -> bool:
    """Whether ``obj``'s class is one of Python's builtins."""
    return type(obj).__module__ in ("builtins", "__builtin__")


def isinstance_namedtuple(obj: object) -> bool:
    """Whether ``obj`` is a ``collections.namedtuple`` / ``typing.NamedTuple`` instance."""
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def is_zero_param(parameter: Any) -> bool:
    """Whether ``parameter`` is a stage-3 (partitioned) parameter."""
    return torch.is_tensor(parameter) and hasattr(parameter, "ds_id")


def apply_to_tensors_only(
    function: Callable[[torch.Tensor], Any], value: Any, warning_msg_fn: Callable[[Any], str] | None = None
) -> Any:
    """``function`` applied to every tensor in ``value`` (nested tuples, lists, named tuples; dicts in place);
    anything else is returned as it is. A result that lost a stage-3 parameter's attributes keeps the
    parameter as ``ds_param_alias``."""
    global warned
    if isinstance(value, (tuple, list)):
        touched = [apply_to_tensors_only(function, v) for v in value]
        return type(value)(*touched) if isinstance_namedtuple(value) else type(value)(touched)
    if isinstance(value, dict):
        for key in value:
            value[key] = apply_to_tensors_only(function, value[key])
        return value
    if isinstance(value, torch.Tensor):
        out = function(value)
        if is_zero_param(value) and not is_zero_param(out):
            out.ds_param_alias = value
        return out
    if warning_msg_fn is not None and not warned and not is_builtin_type(value):
        if not dist.is_initialized() or dist.get_rank() == 0:
            logger.warning(warning_msg_fn(value))
        warned = True
    return value


def get_mapping_to_flat_buffer(tensors: Iterable[torch.Tensor]) -> list[tuple[torch.Tensor, int, int]]:
    """``(tensor, offset, numel)`` of each tensor laid end to end in one flat buffer."""
    out, offset = [], 0
    for t in tensors:
        out.append((t, offset, t.numel()))
        offset += t.numel()
    return out


def defragment(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Move ``tensors`` (one dtype, one device) into one contiguous flat buffer; each becomes a view of it."""
    if len({t.dtype for t in tensors}) != 1 or len({t.device for t in tensors}) != 1:
        raise AssertionError("defragment takes tensors of one dtype on one device")
    layout = get_mapping_to_flat_buffer(tensors)
    staged = torch.empty(sum(t.numel() for t in tensors), dtype=tensors[0].dtype, device="cpu")
    device = tensors[0].device
    for t, offset, numel in layout:
        staged.narrow(0, offset, numel).copy_(t.reshape(-1))
        t.data = torch.empty(0, dtype=t.dtype, device=t.device)
    gc.collect()
    get_accelerator().empty_cache()
    buffer = staged.to(device)
    for t, offset, numel in layout:
        t.data = buffer.narrow(0, offset, numel)
    return buffer
