"""``clone_tensors_for_torch_save``: a copy of a nested structure whose tensors own their storage."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["clone_tensors_for_torch_save"]


def clone_tensors_for_torch_save(item: Any, device: torch.device | str = "cpu") -> Any:
    """``item`` with every tensor (nested in lists, tuples, dicts) detached and copied onto ``device``.

    A view of a larger buffer saved as is writes the whole buffer; a copy writes only its own elements.
    Tensors already on ``device`` are cloned, others moved (the move is a copy). Other values pass through.
    """
    device = torch.device(device)
    if torch.is_tensor(item):
        return item.detach().clone() if item.device == device else item.detach().to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)((k, clone_tensors_for_torch_save(v, device)) for k, v in item.items())
    return item
