"""The shared spawn helper really joins processes into one gloo group."""

import torch
import torch.distributed as dist
from rank_testing import spawn


def _sum_of_ranks(rank: int, world_size: int) -> float:
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    return t.item()


def test_spawn():
    assert spawn(_sum_of_ranks, 2) == [3.0, 3.0]
