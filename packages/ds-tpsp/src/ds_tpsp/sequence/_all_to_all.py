"""The Ulysses exchange: one ``all_to_all_single`` that scatters one dimension and gathers another.

Rank ``r`` of a group of ``p`` sends the ``j``-th of ``p`` equal chunks of its ``scatter_idx`` dimension to rank
``j`` and concatenates, in rank order, what it receives along ``gather_idx``. With heads scattered and the
sequence gathered, each rank goes from its slice of the sequence with every head to the whole sequence with its
slice of the heads (DeepSpeed-Ulysses' layout: rank ``r`` keeps heads ``r*h/p .. (r+1)*h/p``); the reverse
exchange (scatter and gather swapped) is both the way back and the gradient.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ds_tpsp.sequence._errors import check_divisible


def all_to_all_exchange(
    x: Tensor, group: Any, scatter_idx: int, gather_idx: int, where: str = "all_to_all"
) -> Tensor:
    """Scatter ``x`` along ``scatter_idx`` over ``group`` and gather along ``gather_idx`` (no autograd)."""
    p = dist.get_world_size(group)
    if p == 1:
        return x
    scatter_idx %= x.dim()
    gather_idx %= x.dim()
    check_divisible(
        f"dimension {scatter_idx} of the {tuple(x.shape)} tensor",
        x.shape[scatter_idx],
        p,
        where,
        "the heads (or the sequence on the way back) must split evenly over the sequence-parallel group",
    )
    # [.., p*n, ..] -> [p, .., n, ..]: the chunk for rank j is row j, contiguous for the collective
    send = x.unflatten(scatter_idx, (p, x.shape[scatter_idx] // p)).movedim(scatter_idx, 0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    # row i came from rank i: put it before the gather dimension and merge, rank-major
    return recv.movedim(0, gather_idx).flatten(gather_idx, gather_idx + 1)


class _SeqAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any, scatter_idx: int, gather_idx: int, where: str) -> Tensor:
        ctx.group, ctx.scatter_idx, ctx.gather_idx, ctx.where = group, scatter_idx, gather_idx, where
        return all_to_all_exchange(x, group, scatter_idx, gather_idx, where)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        # the adjoint of a permutation of chunks is the inverse permutation: the swapped exchange
        return (
            _SeqAllToAll.apply(grad.contiguous(), ctx.group, ctx.gather_idx, ctx.scatter_idx, ctx.where),
            None,
            None,
            None,
            None,
        )


def seq_all_to_all(
    x: Tensor, group: Any, scatter_idx: int, gather_idx: int, where: str = "all_to_all"
) -> Tensor:
    """Differentiable :func:`all_to_all_exchange`."""
    return _SeqAllToAll.apply(x, group, scatter_idx, gather_idx, where)


def single_all_to_all(
    input: Tensor,
    scatter_idx: int,
    gather_idx: int,
    batch_dim_idx: int,
    group: Any,
    async_op: bool = False,
    handle: Any = None,
    type: Any = None,
    num_kv_heads: int | None = None,
) -> Tensor:
    """DeepSpeed's one-shot exchange (no autograd): scatter ``scatter_idx``, gather ``gather_idx``.

    ``batch_dim_idx`` only tells DeepSpeed's layout code where the batch is; the exchange here moves chunks of
    the named dimensions whatever the layout. The overlapped form (``async_op=True``, CUDA streams) and uneven
    head counts are not in ds and raise.
    """
    if async_op:
        raise NotImplementedError(
            "single_all_to_all: async_op=True (DeepSpeed's overlapped q/k exchange on CUDA streams) is not in "
            "ds; call it with async_op=False"
        )
    return all_to_all_exchange(input, group, scatter_idx, gather_idx, "single_all_to_all")
