"""One launch scheduler for bucketed gradient reductions: stage 0, ZeRO 1/2 and ZeRO 3.

Gradient hooks (``register_post_accumulate_grad_hook``) count the parameters of each bucket whose gradient
is final and launch the bucket's reduction as soon as all of them are, while backward is still running
(gloo runs ``async_op=True`` collectives on its own threads; CUDA callers run them on a side stream).
Every rank plans the same buckets and launches them in the same fixed order, because collectives must
match across ranks: a bucket that is ready early waits for the buckets before it.

Hooks act only while the owner is *armed*, i.e. inside its own backward. A gradient that reaches a
parameter at any other time (another engine's backward, a loss built from two engines' models) stays in
``.grad``, where ``module.zero_grad()`` can clear it as in plain PyTorch, and is read when the bucket is
launched, so the result is the one stage 0 would compute from the same ``.grad``.

ZeRO 3 learns of final gradients from its own gather hooks (the parameter is released right after), so
it builds the schedule with ``hooks=False`` and calls ``ready(param)`` itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ._weak_hook import weak_post_accumulate_grad_hook

__all__ = ["BucketSchedule"]


class BucketSchedule:
    """Launch ``launch(k)`` for buckets ``k = 0, 1, ...`` in order, each once its parameters' grads are final.

    ``on_grad(param)``, when given, runs first for every gradient that arrives while armed (ZeRO stages
    it into a buffer or frees it there). ``arm(launch_early)`` before the owner's backward: with
    ``launch_early`` the hooks launch ready buckets; without it they only call ``on_grad``.
    ``disarm()`` after it. ``launch_rest()`` launches every bucket not launched yet; ``reset()`` starts
    the next round of launches. With ``hooks=False`` the caller reports each final gradient with
    ``ready(param)`` instead of the schedule hooking the parameters.
    """

    def __init__(
        self,
        buckets: Sequence[Sequence[nn.Parameter]],
        launch: Callable[[int], None],
        on_grad: Callable[[nn.Parameter], None] | None = None,
        *,
        hooks: bool = True,
    ) -> None:
        self._sizes = [len(b) for b in buckets]
        self._bucket_of = {id(p): k for k, b in enumerate(buckets) for p in b}
        self._launch = launch
        self._on_grad = on_grad
        self._pending = list(self._sizes)
        self.next = 0  # the next bucket to launch
        self.armed = False
        self._launch_early = False
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        if hooks:
            self._handles = [weak_post_accumulate_grad_hook(p, self.ready) for b in buckets for p in b]

    def __len__(self) -> int:
        return len(self._sizes)

    def arm(self, launch_early: bool) -> None:
        """Hooks act from now on (the owner's backward starts); ``launch_early`` lets them launch buckets."""
        self.armed = True
        self._launch_early = launch_early

    def disarm(self) -> None:
        """Hooks ignore gradients again (the owner's backward is over)."""
        self.armed = False

    def reset(self) -> None:
        """Forget launches and counts: the next round starts at bucket 0."""
        self._pending = list(self._sizes)
        self.next = 0

    def launch_rest(self) -> None:
        """Launch, in order, every bucket not launched yet."""
        while self.next < len(self._sizes):
            k = self.next
            self.next += 1
            self._launch(k)

    def remove_hooks(self) -> None:
        """Detach the gradient hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def ready(self, param: nn.Parameter) -> None:
        """``param``'s gradient is final for this backward: launch every bucket that is complete, in order.

        What the gradient hook does; callers with ``hooks=False`` call it themselves. Ignored unless armed.
        """
        if not self.armed:
            return
        if self._on_grad is not None:
            self._on_grad(param)
        if not self._launch_early:
            return
        self._pending[self._bucket_of[id(param)]] -= 1
        while self.next < len(self._sizes) and self._pending[self.next] <= 0:
            k = self.next
            self.next += 1
            self._launch(k)
