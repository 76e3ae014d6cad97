"""DistributedAttention on real gloo ranks: the exchange's layout and gradient, and training equal to sp 1."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _ulysses_model import train
from ds_tpsp.sequence import DistributedAttention, SequenceParallelError, all_to_all_exchange, seq_all_to_all
from rank_testing import spawn


def _train_ranks(rank: int, world: int) -> list[float]:
    return train(dist.group.WORLD)


@pytest.mark.parametrize("sp", [2, 4])
def test_ulysses_model_trains_like_one_rank(sp: int) -> None:
    reference = train(None)
    losses = spawn(_train_ranks, sp)
    for rank_losses in losses:
        assert rank_losses == pytest.approx(reference, rel=1e-5)
    assert reference[-1] < reference[0]  # it learns


def _layouts(rank: int, world: int) -> None:
    group = dist.group.WORLD
    torch.manual_seed(0)
    # sequence-first [s, b, h, d], DeepSpeed's default indices: the whole sequence, this rank's heads
    full = torch.randn(8, 2, 4, 3)
    local = full.chunk(world, dim=0)[rank]
    out = all_to_all_exchange(local, group, 2, 0)
    assert torch.equal(out, full.chunk(world, dim=2)[rank])
    assert torch.equal(all_to_all_exchange(out, group, 0, 2), local)
    # batch-first [b, s, h, d] (scatter 2, gather 1)
    full_b = full.transpose(0, 1).contiguous()
    out_b = all_to_all_exchange(full_b.chunk(world, dim=1)[rank], group, 2, 1)
    assert torch.equal(out_b, full_b.chunk(world, dim=2)[rank])
    # the gradient is the exchange back: d(sum(w * out))/d(local) = w routed back
    x = local.clone().requires_grad_(True)
    w = torch.randn(8, 2, 4 // world, 3, generator=torch.Generator().manual_seed(rank))
    (seq_all_to_all(x, group, 2, 0) * w).sum().backward()
    assert torch.equal(x.grad, all_to_all_exchange(w, group, 0, 2))


def test_exchange_layout_and_gradient() -> None:
    spawn(_layouts, 2)


def _identity_attention(rank: int, world: int) -> None:
    """The local attention sees the whole sequence and its slice of heads; rotary embedding applied there."""
    seen = {}

    def local(q, k, v):
        seen["shape"] = tuple(q.shape)
        return q

    attn = DistributedAttention(local, dist.group.WORLD)  # DeepSpeed's defaults: [s, b, h, d]
    q = torch.randn(4, 2, 4, 6)
    assert torch.equal(attn(q, q, q, 1), q)
    assert seen["shape"] == (4 * world, 2, 4 // world, 6)
    cos, sin = torch.ones(1, 4 * world, 1, 6), torch.zeros(1, 4 * world, 1, 6)
    assert torch.equal(attn(q, q, q, 1, (cos, sin)), q)


def test_distributed_attention_local_view() -> None:
    spawn(_identity_attention, 2)


def _bad_heads(rank: int, world: int) -> str:
    attn = DistributedAttention(lambda q, k, v: q, dist.group.WORLD, 2, 1)
    q = torch.randn(2, 4, 3, 8)  # 3 heads over 2 ranks
    with pytest.raises(SequenceParallelError) as err:
        attn(q, q, q, 0)
    return str(err.value)


def test_heads_not_divisible_names_module_and_numbers() -> None:
    message = spawn(_bad_heads, 2)[0]
    assert "DistributedAttention" in message and "3 heads" in message and "degree 2" in message
