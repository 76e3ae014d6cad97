"""DeepSpeed's ``deepspeed.runtime.zero.partition_parameters``: stage 3's ``Init`` and its helpers.

``Init``, ``GatheredParameters`` and ``register_external_parameter`` are ds_engine.zero's;
``unregister_external_parameter`` is ds_zero's (both keep a module's external parameters where DeepSpeed does,
``module._external_params``). ``partitioned_param_data_shape`` is the shape a partitioned parameter shows
(``param.shape``; its data lives in ``ds_tensor``), ``[0]`` as in DeepSpeed.

``zero_wrapper_for_fp_tensor_constructor`` and ``_orig_torch_arange`` are here because transformers
patches the first around ``zero.Init`` (to keep ``torch.arange`` from being cast). DeepSpeed's
``zero.Init`` routes torch's tensor constructors through that wrapper, so every floating tensor built
inside it (buffers included) takes the Init's dtype and device. ds's ``zero.Init`` does not patch
torch's constructors: it casts and partitions parameters as each module is built; buffers keep the
dtype their module gave them. The wrapper below does what DeepSpeed's does, for code that calls it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from ds_engine._missing import missing_class
from ds_engine.zero import GatheredParameters, Init, ZeroParamStatus, register_external_parameter
from ds_zero.stage3 import unregister_external_parameter

# what a partitioned parameter's own shape is (its data is in ds_tensor): DeepSpeed's module global
partitioned_param_data_shape = [0]

# torch's constructors as they were before any zero.Init (DeepSpeed keeps these names)
_orig_torch_tensor = torch.tensor
_orig_torch_empty = torch.empty
_orig_torch_zeros = torch.zeros
_orig_torch_ones = torch.ones
_orig_torch_full = torch.full
_orig_torch_arange = torch.arange
_orig_torch_eye = torch.eye
_orig_torch_randn = torch.randn


def zero_wrapper_for_fp_tensor_constructor(
    fn: Callable[..., torch.Tensor], target_fp_dtype: torch.dtype, target_device: Any = None
) -> Callable[..., torch.Tensor]:
    """``fn`` placed on ``target_device`` where the call names no device and, for floating results, cast in
    place to ``target_fp_dtype`` (the tensor stays a leaf, ``requires_grad`` kept); a None leaves that part
    alone: DeepSpeed's wrapper for tensor constructors inside ``zero.Init``."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("device") is None and target_device is not None:
            kwargs["device"] = target_device
        tensor = fn(*args, **kwargs)
        if target_fp_dtype is not None and tensor.is_floating_point():
            tensor.data = tensor.data.to(target_fp_dtype)
        return tensor

    return wrapped


class MultipleAllGatherHandles:
    """Several all-gather handles waited on as one; ``wait`` passes ``handle_dependency`` to each by keyword, as
    DeepSpeed's does (ds's own stage 3 hands out no handles: this groups handles code makes itself)."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def wait(self, handle_dependency: bool = True) -> None:
        for handle in self.handles:
            handle.wait(handle_dependency=handle_dependency)


# DeepSpeed's handles of its per-parameter all-gathers: ds's stage 3 gathers a module's parameters from its
# flat partition on its own fetch schedule, and hands out no handles.
_HANDLES = "DeepSpeed's stage-3 all-gather handles (ds gathers from its flat partition and returns none)"
_USE = "Gather parameters with deepspeed.zero.GatheredParameters (or let the module's forward gather them)."
AllGatherHandle = missing_class(__name__, "AllGatherHandle", _HANDLES, _USE)
AllGatherCoalescedHandle = missing_class(__name__, "AllGatherCoalescedHandle", _HANDLES, _USE)
AllReduceCoalescedHandle = missing_class(__name__, "AllReduceCoalescedHandle", _HANDLES, _USE)
NoGatherHandle = missing_class(__name__, "NoGatherHandle", _HANDLES, _USE)
NoGatherCoalescedHandle = missing_class(__name__, "NoGatherCoalescedHandle", _HANDLES, _USE)

__all__ = [
    "AllGatherCoalescedHandle",
    "AllGatherHandle",
    "AllReduceCoalescedHandle",
    "MultipleAllGatherHandles",
    "NoGatherCoalescedHandle",
    "NoGatherHandle",
    "GatheredParameters",
    "Init",
    "ZeroParamStatus",
    "partitioned_param_data_shape",
    "register_external_parameter",
    "unregister_external_parameter",
    "zero_wrapper_for_fp_tensor_constructor",
]
