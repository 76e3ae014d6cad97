"""Gradient hooks that do not keep their owner alive.

A hook registered with ``register_post_accumulate_grad_hook`` is held by the parameter's C++ autograd
state, where Python's garbage collector cannot see it. A hook that refers (through its owner) back to
the parameter therefore makes a cycle that is never collected: a dropped engine would keep its
reducer, its flat weight buffer and its optimizer state alive for the life of the process. These hooks
hold their owner weakly, so dropping the owner frees everything; a hook whose owner is gone does
nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from torch import nn
from torch.utils.hooks import RemovableHandle

__all__ = ["weak_post_accumulate_grad_hook"]


def weak_post_accumulate_grad_hook(
    param: nn.Parameter, method: Callable[[nn.Parameter], None]
) -> RemovableHandle:
    """``param.register_post_accumulate_grad_hook(method)`` with ``method``'s object held weakly."""
    ref = weakref.WeakMethod(method)

    def hook(p: nn.Parameter) -> None:
        bound = ref()
        if bound is not None:
            bound(p)

    return param.register_post_accumulate_grad_hook(hook)
