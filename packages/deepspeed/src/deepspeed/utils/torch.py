"""DeepSpeed's ``deepspeed.utils.torch`` helpers: torch version checks and gradient hooks, for code that calls
them (DeepSpeed's own modules and user code written against it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.torch_version import TorchVersion

__all__ = ["is_functorch_transforming", "jit_script_compat", "register_grad_hook", "required_torch_version"]

_logger = logging.getLogger(__name__)


def required_torch_version(min_version: Any = None, max_version: Any = None) -> bool:
    """Whether the running torch is at least ``min_version`` and at most ``max_version`` (either may be a
    number, ``2.1``, or a string); at least one bound is required, as in DeepSpeed (AssertionError)."""
    assert min_version or max_version, "Must provide a min_version or max_version argument"
    running = TorchVersion(torch.__version__)  # compares as a version with strings (torch's own packaging)
    if min_version and running < str(min_version):
        return False
    return not (max_version and running > str(max_version))


def is_functorch_transforming() -> bool:
    """True inside ``torch.func.grad`` / ``vmap`` / ``jacrev`` (functorch's interpreter stack is not empty)."""
    peek = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def register_grad_hook(param: torch.nn.Parameter, hook: Callable[[torch.Tensor], None]) -> Any:
    """Call ``hook(param)`` after each gradient is accumulated into ``param.grad``; returns the handle."""
    return param.register_post_accumulate_grad_hook(hook)


def jit_script_compat(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by ``torch.compile``, else ``torch.jit.script``, else ``fn`` unchanged (logged at debug)."""
    for compile_fn in (torch.compile, torch.jit.script):
        try:
            return compile_fn(fn)
        except Exception:  # noqa: BLE001 - each failure falls through to the next, as DeepSpeed's does
            _logger.debug("%s failed for %r", compile_fn.__name__, fn, exc_info=True)
    return fn
