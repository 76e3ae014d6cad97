"""Run torch Adam/AdamW on the fused kernel when the script left the kernel choice to torch.

torch's default for ``fused=None, foreach=None`` on CPU is the foreach path. Measured on 2 gloo ranks
with 13.3M fp32 elements (issue 18): foreach AdamW 95 ms per step, ``fused=True`` 9.3 ms, the same math
to rounding. ds applies this to a client optimizer after the engine has re-pointed it at the tensors it
really steps (fp32 masters, ZeRO partitions), so the check sees the right devices and dtypes at every
stage. An explicit ``fused=`` or ``foreach=`` is never overridden.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

__all__ = ["fused_kernel_supported", "prefer_fused_kernel"]

logger = logging.getLogger("ds_optim")

# torch's own fused Adam kernels exist for these device types (torch >= 2.4 for the CPU one)
FUSED_DEVICE_TYPES = ("cpu", "cuda")
_ADAM_TYPES = (torch.optim.Adam, torch.optim.AdamW)
_logged = False


def fused_kernel_supported(tensors: Iterable[torch.Tensor]) -> bool:
    """True when torch's fused Adam kernel takes every tensor (floating point on a supported device)."""
    return all(t.device.type in FUSED_DEVICE_TYPES and t.is_floating_point() for t in tensors)


def prefer_fused_kernel(optimizer: object, log: logging.Logger | None = logger) -> bool:
    """Switch a torch ``Adam``/``AdamW`` whose ``fused`` and ``foreach`` were left at None to ``fused=True``.

    Only the exact torch classes are switched (a subclass may rely on the path it was written for), only
    groups whose every parameter the fused kernel takes, and never a differentiable one. Call it after
    the optimizer's groups point at the tensors that will be stepped. Returns True when any group was
    switched; says so once per process in ``log`` (INFO; the engine passes its own logger on rank 0 and
    None, silence, on the others).
    """
    global _logged
    if type(optimizer) not in _ADAM_TYPES:
        return False
    switched = False
    for group in optimizer.param_groups:
        if group.get("fused") is not None or group.get("foreach") is not None:
            continue  # the script chose a kernel: keep it
        if group.get("differentiable") or not fused_kernel_supported(group["params"]):
            continue
        group["fused"] = True
        switched = True
    if switched and log is not None and not _logged:
        _logged = True
        log.info(
            "%s: running the update on torch's fused kernel (fused=True) instead of torch's default "
            "foreach path, because the optimizer left fused= and foreach= at None: same math, about 10x "
            "faster on CPU. To keep the foreach path, pass foreach=True (or fused=False) to the optimizer",
            type(optimizer).__name__,
        )
    return switched
