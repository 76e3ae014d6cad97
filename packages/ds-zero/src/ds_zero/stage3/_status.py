"""DeepSpeed's stage-3 parameter attributes: ``ds_id``, ``ds_status``, ``ds_numel``, ``ds_shape``, ``ds_tensor``.

Code written for DeepSpeed reads them off a partitioned parameter: transformers counts a model's
parameters with ``ds_numel`` (``p.numel()`` is 0 while partitioned), others check ``ds_status`` before
reading a weight. ds keeps them current wherever a parameter is cut, gathered or released.
"""

from __future__ import annotations

import itertools
from enum import Enum

import torch

__all__ = ["ZeroParamStatus", "mark", "set_status"]

_ids = itertools.count()


class ZeroParamStatus(Enum):
    """A stage-3 parameter's state: gathered whole, partitioned, or being gathered (DeepSpeed's values)."""

    AVAILABLE = 1
    NOT_AVAILABLE = 2
    INFLIGHT = 3


def mark(p: torch.Tensor, shape: torch.Size, local: torch.Tensor, whole: bool) -> None:
    """Set a partitioned parameter's attributes: ``local`` is this rank's piece of it (``ds_tensor``)."""
    if not hasattr(p, "ds_id"):
        p.ds_id = next(_ids)
    p.ds_shape = torch.Size(shape)
    p.ds_numel = p.ds_shape.numel()
    p.ds_tensor = local
    set_status(p, ZeroParamStatus.AVAILABLE if whole else ZeroParamStatus.NOT_AVAILABLE)


def set_status(p: torch.Tensor, status: ZeroParamStatus) -> None:
    p.ds_status = status
