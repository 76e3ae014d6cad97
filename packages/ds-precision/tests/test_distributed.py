"""Two real gloo processes: an overflow on one rank makes every rank skip; the norm spans ranks."""

import math

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


def test_overflow_on_one_rank_makes_every_rank_skip():
    r0, r1 = spawn(_run_rank, 2, {1, 2})
    assert r0[0] == r1[0] == [True, False, False, True]
    assert r0[3] == r1[3]  # identical loss-scale trajectories
    assert r0[4] == r1[4] == 2
    # the clipped update used the same global norm on both ranks: sqrt(n0^2 + n1^2)
    for step in (0, 3):
        expected = math.hypot(r0[2][step], r1[2][step])
        assert math.isclose(r0[1][step], expected, rel_tol=1e-3)
        assert r0[1][step] == r1[1][step]  # so both ranks clip with the same coefficient
