"""Gradients that reached the model outside ``engine.backward(loss)``: ``step()`` refuses to apply them.

ds scales, reduces and partitions gradients inside ``engine.backward`` only. A gradient produced by a
``loss.backward()`` the script ran itself is this rank's alone (unaveraged, unscaled for fp16 and gradient
accumulation), so stepping on it would leave each rank with different weights and no error. DeepSpeed
0.19.8 refuses such a backward at ZeRO 0 and reduces it at ZeRO 1-3 (its hooks run its backward's prologue
and epilogue); ds refuses it at every stage, at the next ``step()``.

A gradient hook on every trainable parameter notes the ones that got a gradient while no
``engine.backward`` ran. The note is dropped when the engine clears its gradients (``zero_grad()``, the
boundary ``step()``), or when an ``engine.backward`` that reduces them along starts (a two-engine GAN's
generator pass writes into the discriminator before the discriminator's backward); a noted gradient the
script cleared itself (``module.zero_grad()``) is not refused, unless a wrapper's hook had already taken it
out of ``.grad`` (ZeRO 3, fp32 accumulation), where only the engine's ``zero_grad()`` drops it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import ds_zero
from torch import nn

__all__ = ["OutsideGradientError", "OutsideGradients"]


class OutsideGradientError(RuntimeError):
    """``step()`` after gradients that no ``engine.backward(loss)`` produced."""


class OutsideGradients:
    """Watches ``module``'s trainable parameters for gradients produced outside ``engine.backward``."""

    def __init__(self, module: nn.Module) -> None:
        self._depth = 0  # engine.backward calls running (a reentrant checkpoint backward nests)
        self._names = {id(p): n for n, p in module.named_parameters() if p.requires_grad}
        self._params = {id(p): p for p in module.parameters() if p.requires_grad}
        self._noted: dict[int, bool] = {}  # id(param) -> its gradient was taken out of .grad by a hook
        self._handles = [
            ds_zero.weak_post_accumulate_grad_hook(p, self._arrived) for p in self._params.values()
        ]

    @contextmanager
    def engine_backward(self, adopt_earlier: bool) -> Iterator[None]:
        """Gradients arriving inside this context are the engine's.

        ``adopt_earlier``: gradients already in ``.grad`` when it starts add into this backward's and are
        reduced with them (stage 0 averages every ``.grad``; ZeRO 1 and 2 take them in likewise), which is
        right only where nothing had to scale them (no fp16 loss scale, no accumulation's 1/GAS): then the
        notes on them are dropped. Otherwise they stay refused even once this backward has taken them out of
        ``.grad`` (ZeRO 2); gradients a wrapper's hook already took stay refused; cleared ones are forgotten.
        """
        if self._depth == 0 and self._noted:
            kept = {i for i, taken in self._noted.items() if taken or self._params[i].grad is not None}
            self._noted = {i: True for i in kept if not adopt_earlier or self._noted[i]}
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def _arrived(self, param: nn.Parameter) -> None:
        # post-accumulate hooks run in registration order: the optimizer's ran first, so a None .grad here
        # means one of them moved it into its own buffers (ZeRO 3's partitions, fp32 accumulation)
        if self._depth == 0:
            self._noted[id(param)] = self._noted.get(id(param), False) or param.grad is None

    def clear(self) -> None:
        """The engine cleared every gradient."""
        self._noted.clear()

    def check(self) -> None:
        """Raise when gradients produced outside ``engine.backward`` would be stepped on."""
        if not self._noted:
            return
        noted = self._noted
        names = [
            n for i, n in self._names.items() if i in noted and (noted[i] or self._params[i].grad is not None)
        ]
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise OutsideGradientError(
                f"gradients were produced outside engine.backward(loss) (a direct loss.backward() or "
                f"engine.scale(loss).backward()) for {shown}; ds averages them across data-parallel ranks, "
                "scales them for fp16 and gradient accumulation and partitions them only inside "
                "engine.backward, so stepping would apply each rank's own gradients and the ranks' weights "
                "would silently diverge. Call engine.backward(loss) instead of loss.backward(), or clear "
                "those gradients (engine.zero_grad()) before engine.step()"
            )

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
