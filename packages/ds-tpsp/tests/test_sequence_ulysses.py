"""DistributedAttention on real gloo ranks: the exchange's layout and gradient, training equal to sp 1 at sp 2
and sp 4, and the error for heads that do not divide. One 4-rank run does it all (CI time): sp 4 over the world,
sp 2 over ranks {0, 1} and {2, 3} at once."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _ulysses_model import train
from ds_tpsp.sequence import DistributedAttention, SequenceParallelError, all_to_all_exchange, seq_all_to_all
from rank_testing import spawn


def _layouts(group) -> None:
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    torch.manual_seed(0)
    # sequence-first [s, b, h, d], DeepSpeed's default indices: the whole sequence, this rank's heads
    full = torch.randn(8, 2, 4, 3)
    local = full.chunk(world, dim=0)[rank]
    out = all_to_all_exchange(local, group, 2, 0)
    assert torch.equal(out, full.chunk(world, dim=2)[rank])
    assert torch.equal(all_to_all_exchange(out, group, 0, 2), local)
    # batch-first [b, s, h, d] (scatter 2, gather 1)
    full_b = full.transpose(0, 1).contiguous()
    assert torch.equal(
        all_to_all_exchange(full_b.chunk(world, dim=1)[rank], group, 2, 1), full_b.chunk(world, 2)[rank]
    )
    # the gradient is the exchange back: d(sum(w * out))/d(local) = w routed back
    x = local.clone().requires_grad_(True)
    w = torch.randn(8, 2, 4 // world, 3, generator=torch.Generator().manual_seed(rank))
    (seq_all_to_all(x, group, 2, 0) * w).sum().backward()
    assert torch.equal(x.grad, all_to_all_exchange(w, group, 0, 2))


def _local_view(group) -> None:
    """The local attention sees the whole sequence and its slice of heads; rotary embedding applied there."""
    world = dist.get_world_size(group)
    seen = {}

    def local(q, k, v):
        seen["shape"] = tuple(q.shape)
        return q

    attn = DistributedAttention(local, group)  # DeepSpeed's defaults: [s, b, h, d]
    q = torch.randn(4, 2, 4, 6)
    assert torch.equal(attn(q, q, q, 1), q)
    assert seen["shape"] == (4 * world, 2, 4 // world, 6)
    cos, sin = torch.ones(1, 4 * world, 1, 6), torch.zeros(1, 4 * world, 1, 6)
    assert torch.equal(attn(q, q, q, 1, (cos, sin)), q)


def _bad_heads(group) -> str:
    attn = DistributedAttention(lambda q, k, v: q, group, 2, 1)
    q = torch.randn(2, 4, 3, 8)  # 3 heads
    try:
        attn(q, q, q, 0)
    except SequenceParallelError as err:
        return str(err)
    return "no error"


def _all(rank: int, world: int) -> dict:
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # collective: every rank makes both
    pair = pairs[rank // 2]
    out = {"sp4": train(dist.group.WORLD), "sp2": train(pair)}
    _layouts(dist.group.WORLD)
    _layouts(pair)
    _local_view(pair)
    out["bad_heads"] = _bad_heads(dist.group.WORLD)
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn(_all, 4)


@pytest.mark.parametrize("sp", ["sp2", "sp4"])
def test_ulysses_model_trains_like_one_rank(ranks: list[dict], sp: str) -> None:
    reference = train(None)
    for result in ranks:
        assert result[sp] == pytest.approx(reference, rel=1e-5)
    assert reference[-1] < reference[0]  # it learns


def test_heads_not_divisible_names_module_and_numbers(ranks: list[dict]) -> None:
    message = ranks[0]["bad_heads"]
    assert "DistributedAttention" in message and "3 heads" in message and "degree 4" in message
