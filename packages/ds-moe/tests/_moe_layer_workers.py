"""Module-level workers for ds-moe's multi-rank tests (rank_testing.spawn: real processes, gloo)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from ds_moe import MoE, reduce_expert_gradients, stats
from torch import nn

WIDTH, EXPERTS = 8, 4
NO_NOISE = {"top2_2nd_expert_sampling": False}  # both layers route alike (no random draws)


def expert() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, 16), nn.ReLU(), nn.Linear(16, WIDTH))


def groups(world: int, ep: int) -> tuple:
    """DeepSpeed's layout: ep consecutive ranks exchange tokens; ranks ``ep`` apart hold the same experts."""
    ep_groups = [dist.new_group(list(range(s, s + ep))) for s in range(0, world, ep)]
    dp_groups = [dist.new_group(list(range(s, world, ep))) for s in range(ep)]
    rank = dist.get_rank()
    return ep_groups[rank // ep], dp_groups[rank % ep]


def ep_matches_one_rank(rank: int, world: int, ep: int, k: int, drop: bool) -> dict:
    """An ``ep``-way layer against one holding every expert, each rank on its own tokens: outputs, l_aux,
    counts, input gradients, and expert gradients (reduced over the expert-data group) agree."""
    ep_group, edp_group = groups(world, ep)
    torch.manual_seed(0)
    ref = MoE(WIDTH, expert(), EXPERTS, 1, k, min_capacity=0, drop_tokens=drop, use_rts=False, **NO_NOISE)
    for i, e in enumerate(ref.deepspeed_moe.experts.deepspeed_experts):  # distinct experts
        with torch.no_grad():
            for p in e.parameters():
                p.add_(0.1 * i)
    layer = MoE(WIDTH, expert(), EXPERTS, ep, k, min_capacity=0, drop_tokens=drop, use_rts=False, **NO_NOISE)
    layer.set_process_groups(ep_group, edp_group)
    local = EXPERTS // ep
    first = (rank % ep) * local
    with torch.no_grad():
        layer.deepspeed_moe.gate.wg.weight.copy_(ref.deepspeed_moe.gate.wg.weight)
        for j, e in enumerate(layer.deepspeed_moe.experts.deepspeed_experts):
            for p, q in zip(
                e.parameters(), ref.deepspeed_moe.experts.deepspeed_experts[first + j].parameters()
            ):
                p.copy_(q)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(3, 5, WIDTH, generator=g)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    before = dict(stats)
    out, l_aux, counts = layer(xs[0])
    (out.square().sum() + l_aux).backward()
    calls = stats["all_to_all_calls"] - before["all_to_all_calls"]
    sent = stats["all_to_all_bytes"] - before["all_to_all_bytes"]
    capacity = (
        layer.deepspeed_moe.experts_capacity if hasattr(layer.deepspeed_moe, "experts_capacity") else None
    )
    ref_out, ref_aux, ref_counts = ref(xs[1])
    (ref_out.square().sum() + ref_aux).backward()
    # the reference's expert gradients summed over every rank's tokens, as the ep layer's get them through
    # the all-to-all and the expert-data reduction (both divided by the world size)
    ref_grads = [p.grad.clone() for p in ref.deepspeed_moe.experts.parameters()]
    for t in ref_grads:
        dist.all_reduce(t)
        t.div_(world)
    mine = list(layer.deepspeed_moe.experts.parameters())
    reduce_expert_gradients(mine, edp_group, world)
    per_expert = len(mine) // local
    want = [t for t in ref_grads[first * per_expert : (first + local) * per_expert]]
    return {
        "out": (out - ref_out).abs().max().item(),
        "l_aux": (l_aux - ref_aux).abs().item(),
        "counts": counts.tolist() == ref_counts.tolist(),
        "x_grad": (xs[0].grad - xs[1].grad).abs().max().item(),
        "expert_grad": max((p.grad - w).abs().max().item() for p, w in zip(mine, want)),
        "gate_grad": (layer.deepspeed_moe.gate.wg.weight.grad - ref.deepspeed_moe.gate.wg.weight.grad)
        .abs()
        .max()
        .item(),
        "all_to_all_calls": calls,
        "all_to_all_bytes": sent,
        "capacity": capacity,
    }
