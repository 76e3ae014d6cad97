"""A simulated ZeRO partitioning for the state-checkpoint tests: flat groups, padded equal partitions."""

from __future__ import annotations

import torch

# Two param groups; 7*3 + 5 = 26 and 4 + 9 = 13 elements: neither divides evenly by 2 or 4 ranks.
GROUPS = [
    [("layer.weight", (7, 3)), ("layer.bias", (5,))],
    [("norm.weight", (4,)), ("head.weight", (3, 3))],
]
BETAS, EPS, LR = (0.9, 0.999), 1e-8, 1e-2
STATES = ("master", "exp_avg", "exp_avg_sq")


def numel(group: int) -> int:
    """Unpadded length of a group's flat space."""
    n = 0
    for _, shape in GROUPS[group]:
        n += torch.Size(shape).numel()
    return n


def partition(group: int, rank: int, world_size: int, align: int = 2) -> tuple[int, int]:
    """[start, end) of rank's partition: equal partitions of the padded space, padding at the end."""
    n = numel(group)
    padded = -(-n // (align * world_size)) * align * world_size
    size = padded // world_size
    return min(rank * size, n), min((rank + 1) * size, n)


def full_state(seed: int = 0) -> dict[str, list[torch.Tensor]]:
    """The unpartitioned state: per state name, one flat fp32 tensor per group."""
    gen = torch.Generator().manual_seed(seed)
    return {s: [torch.randn(numel(g), generator=gen).abs() for g in range(len(GROUPS))] for s in STATES}


def shard_of(full: dict[str, list[torch.Tensor]], step: int, rank: int, world_size: int):
    """(tensors, meta) of one rank in the ds-flat-shard/1 format."""
    tensors, groups = {}, []
    for g, params in enumerate(GROUPS):
        start, end = partition(g, rank, world_size)
        offsets, off = [], 0
        for name, shape in params:
            offsets.append({"name": name, "shape": list(shape), "offset": off})
            off += torch.Size(shape).numel()
        groups.append(
            {
                "numel": numel(g),
                "shard": [start, end],
                "params": offsets,
                "hparams": {"lr": LR, "betas": list(BETAS), "eps": EPS},
                "scalars": {"step": step},
            }
        )
        for s in STATES:
            tensors[f"g{g}.{s}"] = full[s][g][start:end].clone()
    meta = {
        "format": "ds-flat-shard/1",
        "world_size": world_size,
        "rank": rank,
        "groups": groups,
        "extra": {"loss_scale": 1024.0},
    }
    return tensors, meta


def adam_step(state: dict[str, torch.Tensor], grad: torch.Tensor, step: int) -> None:
    """Element-wise Adam on one slice, in place (``step`` counts from 1)."""
    b1, b2 = BETAS
    state["exp_avg"].mul_(b1).add_(grad, alpha=1 - b1)
    state["exp_avg_sq"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (state["exp_avg_sq"] / (1 - b2**step)).sqrt_().add_(EPS)
    state["master"].addcdiv_(state["exp_avg"], denom, value=-LR / (1 - b1**step))


def grad_for(group: int, step: int) -> torch.Tensor:
    """A deterministic full-length gradient of a group at a step (the same on every rank)."""
    gen = torch.Generator().manual_seed(1000 * step + group)
    return torch.randn(numel(group), generator=gen)
