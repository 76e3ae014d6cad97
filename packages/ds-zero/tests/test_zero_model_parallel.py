"""With a model-parallel group the global norm sums over it (docs/design.md §5), on 4 real ranks (dp 2 x mp 2).

A parameter marked ``tensor_model_parallel`` is a shard: it counts on every model-parallel rank. Any
other parameter is replicated across model-parallel ranks: it counts on model-parallel rank 0 only.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from ds_zero import ZeroOptimizer, ZeroOptions, ZeroStage3Optimizer
from ds_zero.stage3 import Stage3Options
from rank_testing import spawn
from torch import nn

MP = 2


def _model(mp_rank: int) -> nn.Module:
    torch.manual_seed(10 + mp_rank)  # shards differ between model-parallel ranks
    shard = nn.Linear(4, 3)
    for p in shard.parameters():
        p.tensor_model_parallel = True
    torch.manual_seed(99)
    return nn.Sequential(shard, nn.Tanh(), nn.Linear(3, 2))


def _batch(mp_rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(mp_rank)
    return torch.randn(2 * dp, 4, generator=g), torch.randint(0, 2, (2 * dp,), generator=g)


def _expected_norm(dp: int) -> float:
    """On one process: every shard's data-parallel-averaged gradient, plus rank 0's replicated one."""
    sq = 0.0
    for m in range(MP):
        ref = _model(m)
        x, y = _batch(m, dp)
        nn.functional.cross_entropy(ref(x), y).backward()
        counted = list(ref.parameters()) if m == 0 else list(ref[0].parameters())
        sq += sum(float(p.grad.double().pow(2).sum()) for p in counted)
    return math.sqrt(sq)


def _worker(rank: int, world: int) -> dict:
    dp = world // MP
    mp_rank, dp_rank = rank % MP, rank // MP
    dp_groups = [dist.new_group([d * MP + m for d in range(dp)]) for m in range(MP)]
    mp_groups = [dist.new_group([d * MP + m for m in range(MP)]) for d in range(dp)]
    out = {"expected": _expected_norm(dp)}
    groups = {"process_group": dp_groups[mp_rank], "model_parallel_group": mp_groups[dp_rank]}
    for stage in (1, 2, 3):
        model = _model(mp_rank)
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        if stage == 3:  # every parameter partitioned: the counted ranges cut through the shards
            zero = ZeroStage3Optimizer(
                model, sgd, Stage3Options(reduce_bucket_size=5, param_persistence_threshold=0), **groups
            )
        else:
            zero = ZeroOptimizer(sgd, ZeroOptions(stage=stage, reduce_bucket_size=5), **groups)
        x, y = _batch(mp_rank, dp)
        lo = 2 * dp_rank
        zero.backward(nn.functional.cross_entropy(model(x[lo : lo + 2]), y[lo : lo + 2]))
        out[f"stage{stage}"] = (zero.step(), zero.global_grad_norm)
        # an inf in a replicated parameter on the last rank (not counted in the norm) still skips everywhere
        if rank == world - 1:  # model-parallel rank 1: its replicated weight is not in the norm
            model[2].weight.register_hook(lambda g: torch.full_like(g, math.inf))
        zero.backward(nn.functional.cross_entropy(model(x[lo : lo + 2]), y[lo : lo + 2]))
        out[f"stage{stage}-overflow"] = zero.step()
    return out


def test_norm_sums_shards_over_the_model_parallel_group_and_counts_replicas_once():
    results = spawn(_worker, 4)
    for rank, r in enumerate(results):
        for stage in (1, 2, 3):
            stepped, norm = r[f"stage{stage}"]
            assert stepped, f"rank {rank} stage {stage} skipped a finite step"
            assert math.isclose(norm, r["expected"], rel_tol=1e-6), (rank, stage, norm, r["expected"])
            assert r[f"stage{stage}-overflow"] is False, f"rank {rank} stage {stage} stepped over an inf"
