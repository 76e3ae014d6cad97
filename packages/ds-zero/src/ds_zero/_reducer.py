"""Stage 0: bucketed data-parallel all-reduce of gradients (docs/design.md §5)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from ds_config import DSConfig
from torch import nn

from . import _transport
from ._comm import AveragingRule, ProcessGroup, all_reduce_async, flatten, group_size, plan_buckets
from ._schedule import BucketSchedule
from ._sparse import reduce_sparse_grad

__all__ = ["GradientReducer"]

DEFAULT_BUCKET_ELEMS = 500_000_000


# A gradient of at least this many elements is all-reduced where it is, as its own collective within its
# bucket; smaller ones travel flattened together. Measured by tools/bench/bench_zero_collectives.py on the lean
# GPT's gradients (no record kept; git show af730fc:docs/benchmarks/ds-zero.md): flattening its 53 MB into a
# new buffer and copying them back cost about as much as the all_reduce itself.
IN_PLACE_MIN_ELEMS = 1 << 18


@dataclass
class _Bucket:
    params: list[nn.Parameter]
    flat: torch.Tensor | None = None  # the small gradients, flattened
    small: list[nn.Parameter] = field(default_factory=list)  # the parameters whose gradients are in ``flat``
    in_place: list[torch.Tensor] = field(default_factory=list)  # gradients all-reduced where they are
    works: list = field(default_factory=list)


class GradientReducer:
    """Average gradients across data-parallel ranks at a gradient-accumulation boundary (ZeRO stage 0).

    Dense gradients travel in flat buckets of one dtype each, at most ``bucket_size_elems`` elements
    (a larger tensor travels alone). A parameter without a gradient contributes zeros, so every rank
    reduces the same sizes, and afterwards holds the averaged (zero or not) gradient.

    Usage per optimizer step: ``set_boundary(is_boundary)`` before each micro-step's backward, and
    ``reduce()`` after the boundary micro-step's backward. With ``overlap_comm`` the buckets are
    launched asynchronously from gradient hooks while the boundary backward is still running, by the
    :class:`BucketSchedule` ZeRO uses too (a fixed order on every rank; hooks act only between
    ``set_boundary`` and ``reduce``). ``reduce()`` then launches what is left and waits for all of it.
    """

    def __init__(
        self,
        module_or_params: nn.Module | Iterable[nn.Parameter],
        *,
        process_group: ProcessGroup | None = None,
        bucket_size_elems: int = DEFAULT_BUCKET_ELEMS,
        fp32_allreduce: bool = False,
        prescale_gradients: bool = False,
        gradient_predivide_factor: float = 1.0,
        sparse_gradients: bool = False,
        overlap_comm: bool = False,
        gradient_average: bool = True,
    ) -> None:
        if gradient_predivide_factor <= 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
        self.process_group = process_group
        self.fp32_allreduce = fp32_allreduce
        self.overlap_comm = overlap_comm
        self.rule = AveragingRule(
            group_size(process_group), prescale_gradients, gradient_predivide_factor, gradient_average
        )
        params, sparse = _collect(module_or_params, sparse_gradients)
        self._sparse_params = sparse
        self._buckets = _dense_buckets(
            [p for p in params if id(p) not in {id(s) for s in sparse}], bucket_size_elems
        )
        self._stream = None
        self.host_transport = _transport.enable(process_group)  # MPI or shared memory (``_transport.py``)
        self._schedule = BucketSchedule(
            [b.params for b in self._buckets], lambda k: self._launch(self._buckets[k]), hooks=overlap_comm
        )

    @classmethod
    def from_config(
        cls,
        module_or_params: nn.Module | Iterable[nn.Parameter],
        config: DSConfig,
        *,
        process_group: ProcessGroup | None = None,
    ) -> GradientReducer:
        """Build from a loaded config (top-level gradient keys + ``zero_optimization``)."""
        return cls(
            module_or_params,
            process_group=process_group,
            bucket_size_elems=config.zero_optimization.reduce_bucket_size,
            fp32_allreduce=config.fp32_allreduce,
            prescale_gradients=config.prescale_gradients,
            gradient_predivide_factor=config.gradient_predivide_factor,
            sparse_gradients=config.sparse_gradients,
            overlap_comm=config.zero_optimization.overlap_comm,
            gradient_average=config.gradient_allreduce_op == "mean",
        )

    @property
    def bucket_sizes(self) -> list[int]:
        """Elements per dense bucket, in launch order."""
        return [sum(p.numel() for p in b.params) for b in self._buckets]

    def set_boundary(self, is_boundary: bool) -> None:
        """Say whether the coming backward ends an accumulation window (only then do hooks reduce)."""
        self._schedule.reset()
        if is_boundary and self.overlap_comm:
            self._schedule.arm(launch_early=True)
        else:
            self._schedule.disarm()

    def reduce(self) -> None:
        """Average every gradient across ranks; call once after the boundary micro-step's backward."""
        self._schedule.disarm()
        self._schedule.launch_rest()
        for b in self._buckets:
            self._finish(b)
        for p in self._sparse_params:
            p.grad = reduce_sparse_grad(
                p.grad,
                p.shape,
                p.dtype,
                p.device,
                self.rule,
                torch.float32 if self.fp32_allreduce else p.dtype,
                self.process_group,
            )
        self._schedule.reset()

    def remove_hooks(self) -> None:
        """Detach the gradient hooks installed for ``overlap_comm``."""
        self._schedule.remove_hooks()

    def _launch(self, b: _Bucket) -> None:
        stream = self._side_stream(b.params[0].device)
        if stream is None:
            self._all_reduce(b)
        else:
            # the side stream must see the finished gradients before it reads them
            stream.wait_stream(torch.cuda.current_stream(b.params[0].device))
            with torch.cuda.stream(stream):
                self._all_reduce(b)

    def _all_reduce(self, b: _Bucket) -> None:
        """Launch the bucket: large gradients of the reduction dtype in place, the rest flattened together
        (a gradient that is None contributes zeros there)."""
        dtype = torch.float32 if self.fp32_allreduce else b.params[0].dtype
        b.in_place = [
            p.grad
            for p in b.params
            if p.grad is not None
            and p.grad.dtype == dtype
            and p.grad.is_contiguous()
            and p.grad.numel() >= IN_PLACE_MIN_ELEMS
        ]
        whole = {id(g) for g in b.in_place}
        b.small = [p for p in b.params if p.grad is None or id(p.grad) not in whole]
        tensors = list(b.in_place)
        if b.small:
            b.flat = flatten([p.grad for p in b.small], [p.shape for p in b.small], dtype, b.params[0].device)
            tensors.append(b.flat)
        for t in tensors:
            self.rule.before(t)
        b.works = all_reduce_async(tensors, self.process_group)

    def _finish(self, b: _Bucket) -> None:
        for w in b.works:
            w.wait()
        if self._stream is not None:
            torch.cuda.current_stream(b.params[0].device).wait_stream(self._stream)
        factor = self.rule.after_factor()
        if factor != 1.0:
            for g in b.in_place:
                g.mul_(factor)
        if b.flat is not None:
            if (
                factor != 1.0 and b.flat.dtype != b.params[0].dtype
            ):  # fp32_allreduce: scale in fp32, then cast
                b.flat.mul_(factor)
                factor = 1.0
            offset = 0
            for p in b.small:
                n = p.numel()
                chunk = b.flat[offset : offset + n].view_as(p)
                if p.grad is None:
                    p.grad = torch.empty_like(p)
                # the averaging multiply and the copy back into .grad in one pass over the bucket
                if factor != 1.0:
                    torch.mul(chunk, factor, out=p.grad)
                else:
                    p.grad.copy_(chunk)
                offset += n
        b.flat, b.small, b.in_place, b.works = None, [], [], []

    def _side_stream(self, device: torch.device):
        if not (self.overlap_comm and device.type == "cuda"):
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        return self._stream


def _collect(module_or_params, sparse_gradients: bool) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """Trainable parameters (deduplicated, registration order) and the embedding weights to reduce sparsely."""
    if isinstance(module_or_params, nn.Module):
        params = [p for p in module_or_params.parameters() if p.requires_grad]
        sparse = []
        if sparse_gradients:
            sparse = [
                m.weight
                for m in module_or_params.modules()
                if isinstance(m, nn.Embedding | nn.EmbeddingBag) and m.weight.requires_grad
            ]
        return params, sparse
    seen: set[int] = set()
    params = []
    for p in module_or_params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    if sparse_gradients:
        raise ValueError(
            "sparse_gradients needs the nn.Module (to find its nn.Embedding layers), "
            "not a list of parameters: pass the model to GradientReducer"
        )
    return params, []


def _dense_buckets(params: list[nn.Parameter], limit_elems: int) -> list[_Bucket]:
    """Buckets per dtype, in reverse registration order (roughly the order backward produces grads)."""
    by_dtype: dict[tuple[torch.dtype, torch.device], list[nn.Parameter]] = {}
    for p in reversed(params):
        by_dtype.setdefault((p.dtype, p.device), []).append(p)
    buckets = []
    for group in by_dtype.values():
        for idx in plan_buckets([p.numel() for p in group], limit_elems):
            buckets.append(_Bucket([group[i] for i in idx]))
    return buckets
