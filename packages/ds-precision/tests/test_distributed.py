"""Two real gloo processes (fp16; bf16 on the Numba path when installed): an overflow on one rank makes every rank skip."""

import math

import pytest
import torch
from ds_precision import DynamicLossScaler, MixedPrecisionOptimizer
from rank_testing import spawn


def _run_rank(rank, world_size, overflow_steps_on_rank1):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(torch.float16)
    opt = MixedPrecisionOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        scaler=DynamicLossScaler(initial_scale_power=8, hysteresis=1),
        dtype=torch.float16,
        clip_grad=0.01,
        grads_replicated=False,  # each rank keeps its own (different) gradients
        module=model,
    )
    g = torch.Generator().manual_seed(100 + rank)
    applied, norms, local_norms, scales = [], [], [], []
    for step in range(4):
        x = torch.randn(8, 4, generator=g).half()
        opt.backward(model(x).float().pow(2).mean())
        if rank == 1 and step in overflow_steps_on_rank1:
            model.weight.grad.view(-1)[0] = math.inf
        local = torch.cat([p.grad.float().flatten() for p in model.parameters()]).norm() / opt.loss_scale
        local_norms.append(local.item())
        applied.append(opt.step())
        norms.append(opt.global_grad_norm)
        scales.append(opt.loss_scale)
        opt.zero_grad()
    return applied, norms, local_norms, scales, opt.skipped_steps


def _bf16_numba_rank(rank, world_size):
    torch.manual_seed(0)
    model = torch.nn.Linear(300, 300).to(torch.bfloat16)
    opt = MixedPrecisionOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        dtype=torch.bfloat16,
        clip_grad=1.0,
        grads_replicated=False,
        numba_kernels=None,  # the Numba kernels when installed, else the torch path
    )
    g = torch.Generator().manual_seed(100 + rank)
    applied, norms, local = [], [], []
    for step in range(3):
        opt.backward(model(torch.randn(4, 300, generator=g).bfloat16()).float().pow(2).mean())
        if rank == 1 and step == 1:
            model.weight.grad.view(-1)[-1] = math.inf
        local.append(sum(p.grad.double().square().sum().item() for p in model.parameters()))
        applied.append(opt.step())
        norms.append(opt.global_grad_norm)
        opt.zero_grad()
    return applied, norms, local


def _model_parallel_rank(rank, world_size):
    """The world is one model-parallel group; data parallelism is trivial (replicated grads).

    Returns (stepped, global norm, this rank's shard sum of squares, its replicated sum of squares)
    for a finite step, then whether a step with inf only in rank 1's replicated weight was applied.
    """
    import torch.distributed as dist

    torch.manual_seed(rank)
    shard = torch.nn.Linear(3, 4)  # differs per rank, as a tensor-parallel shard does
    for p in shard.parameters():
        p.tensor_model_parallel = True
    torch.manual_seed(99)
    model = torch.nn.Sequential(shard, torch.nn.Linear(4, 2))
    opt = MixedPrecisionOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        dtype=torch.float32,
        clip_grad=1.0,
        model_parallel_group=dist.group.WORLD,
    )
    model(torch.randn(5, 3)).square().sum().backward()
    squares = [sum(float(p.grad.double().square().sum()) for p in m.parameters()) for m in model]
    stepped = opt.step()
    result = [stepped, opt.global_grad_norm, *squares]
    model(torch.randn(5, 3)).square().sum().backward()
    if rank == 1:  # replicated on rank 1 does not count towards the norm, but must still skip
        model[1].weight.grad.fill_(math.inf)
    return result, opt.step()


def _expert_rank(rank, world_size, rule, dtype):
    """A dense layer replicated on both ranks and an "expert" that differs per rank (expert parallelism):
    (stepped, global norm, dense sum of squares, expert sum of squares) of a finite step, then whether a
    step with inf only in rank 1's expert was applied."""
    torch.manual_seed(99)
    dense = torch.nn.Linear(3, 4)
    torch.manual_seed(rank)
    expert = torch.nn.Linear(4, 2)
    model = torch.nn.Sequential(dense, expert).to(dtype)
    opt = MixedPrecisionOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        dtype=dtype,
        clip_grad=1e-3,
        expert_params=expert.parameters(),
        expert_norm=rule,
    )
    model(torch.randn(5, 3).to(dtype)).float().square().sum().backward()
    for p in dense.parameters():  # the data-parallel reduction makes the dense gradients equal
        torch.distributed.all_reduce(p.grad)
    squares = [sum(float(p.grad.double().square().sum()) for p in m.parameters()) for m in model]
    stepped = opt.step()
    result = [stepped, opt.global_grad_norm, *squares]
    model(torch.randn(5, 3).to(dtype)).float().square().sum().backward()
    if rank == 1:
        expert.weight.grad.fill_(math.inf)
    return result, opt.step()


def _both_scenarios(rank, world_size):
    # one spawn for all: starting processes is most of these tests' time on 2 shared cores
    return (
        _run_rank(rank, world_size, {1, 2}),
        _bf16_numba_rank(rank, world_size),
        _model_parallel_rank(rank, world_size),
        _expert_rank(rank, world_size, "rank_mean", torch.float32),
        _expert_rank(rank, world_size, "excluded", torch.bfloat16),
    )


@pytest.fixture(scope="module")
def rank_results():
    return spawn(_both_scenarios, 2)


def test_overflow_on_one_rank_makes_every_rank_skip(rank_results):
    r0, r1 = (r[0] for r in rank_results)
    assert r0[0] == r1[0] == [True, False, False, True]
    assert r0[3] == r1[3]  # identical loss-scale trajectories
    assert r0[4] == r1[4] == 2
    # the clipped update used the same global norm on both ranks: sqrt(n0^2 + n1^2)
    for step in (0, 3):
        expected = math.hypot(r0[2][step], r1[2][step])
        assert math.isclose(r0[1][step], expected, rel_tol=1e-3)
        assert r0[1][step] == r1[1][step]  # so both ranks clip with the same coefficient


def test_bf16_overflow_on_one_rank_makes_every_rank_skip(rank_results):
    r0, r1 = (r[1] for r in rank_results)
    assert r0[0] == r1[0] == [True, False, True]
    for step in (0, 2):
        expected = math.sqrt(r0[2][step] + r1[2][step])
        assert r0[1][step] == r1[1][step] == pytest.approx(expected, rel=1e-9)


def test_model_parallel_norm_sums_shards_and_counts_replicas_once(rank_results):
    (r0, skipped0), (r1, skipped1) = (r[2] for r in rank_results)
    expected = math.sqrt(r0[2] + r1[2] + r0[3])  # both shards, rank 0's replicated layer
    assert r0[0] and r1[0]
    assert r0[1] == r1[1] == pytest.approx(expected, rel=1e-6)
    assert skipped0 is False and skipped1 is False  # an inf in rank 1's replica skips both ranks


def test_expert_norms_follow_deepspeeds_stage0_rules_the_same_on_every_rank(rank_results):
    """Experts differ between ranks: fp32 averages the ranks' norms (DeepSpeed's clip_grad_norm_), bf16 leaves
    the experts out (its fp16/bf16 optimizer); both ranks clip alike, and an inf in one rank's expert skips
    both."""
    (m0, skip0), (m1, skip1) = (r[3] for r in rank_results)
    assert m0[0] and m1[0] and m0[2] == m1[2] and m0[3] != m1[3]
    expected = (math.sqrt(m0[2] + m0[3]) + math.sqrt(m1[2] + m1[3])) / 2
    assert m0[1] == m1[1] == pytest.approx(expected, rel=1e-6)
    (b0, bskip0), (b1, bskip1) = (r[4] for r in rank_results)
    assert b0[0] and b1[0]
    assert b0[1] == b1[1] == pytest.approx(math.sqrt(b0[2]), rel=1e-6)
    assert not (skip0 or skip1 or bskip0 or bskip1)
