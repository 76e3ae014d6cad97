"""The tensor-parallel collectives as autograd functions (Megatron's f, g and gather operators).

``torch.distributed.nn.functional.all_reduce`` sums the gradient in backward too, which is wrong for a
row-parallel output whose gradient is already the same on every rank; these say exactly what each
direction does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import ProcessGroup

__all__ = ["copy_to_tp", "gather_from_tp", "linear_overlapped", "reduce_from_tp", "split_to_tp"]


class _CopyToTP(torch.autograd.Function):
    """Identity in forward; the input gradient summed over the group in backward (before a column split)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Partial outputs summed over the group in forward; the gradient passes through (after a row split)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """The last dimension's shards gathered in forward; each rank's slice of the gradient in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        ctx.group = group
        world = dist.get_world_size(group)
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _own_slice(grad, ctx.group), None


class _SplitToTP(torch.autograd.Function):
    """This rank's slice of the last dimension in forward; the slices gathered in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _own_slice(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _GatherFromTP.forward(ctx, grad, ctx.group), None


class _OverlappedColumnLinear(torch.autograd.Function):
    """``F.linear`` of a column-parallel layer whose backward launches the input gradient's all-reduce
    asynchronously and computes the weight and bias gradients while it runs (``tp_overlap_comm``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_in = grad.matmul(weight).contiguous()
        work = dist.all_reduce(grad_in, group=ctx.group, async_op=True)
        flat_grad = grad.reshape(-1, grad.shape[-1])
        grad_w = flat_grad.t().matmul(x.reshape(-1, x.shape[-1]))
        grad_b = flat_grad.sum(0) if ctx.has_bias else None
        work.wait()
        return grad_in, grad_w, grad_b, None


def _own_slice(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    return x.chunk(world, dim=-1)[rank].contiguous()


def copy_to_tp(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return _ReduceFromTP.apply(x, group)


def gather_from_tp(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return _GatherFromTP.apply(x, group)


def split_to_tp(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return _SplitToTP.apply(x, group)


def linear_overlapped(x, weight, bias, group):
    return _OverlappedColumnLinear.apply(x, weight, bias, group)
