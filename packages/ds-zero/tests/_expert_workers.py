"""Workers for test_zero_expert_groups.py: ZeRO 1/2 with a param group partitioned over its own process group.

A dense layer shared by every rank feeds an "expert" layer that differs between expert-parallel ranks (rank
``r`` holds expert ``r % ep``, as DeepSpeed's groups place them). The expert group is partitioned over the
ranks holding the same expert (the expert-data-parallel group, ``partition_groups``); the dense group over
the world. DeepSpeed's rule for the result: the expert's gradient is summed over its expert-data group and
divided by the world size, the norm spans dense and every expert once, and clipping applies to both.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from ds_zero import ZeroOptimizer, ZeroOptions
from torch import nn

GAS = 2
STEPS = 3
MB = 3  # samples per rank per micro-step
WIDTH, HIDDEN, OUT = 5, 6, 3


def _dense() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(WIDTH, HIDDEN)


def _expert(e: int) -> nn.Linear:
    torch.manual_seed(10 + e)  # every expert-parallel rank starts from other weights
    return nn.Linear(HIDDEN, OUT)


def _data(world: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(7)
    return [
        [
            (torch.randn(world * MB, WIDTH, generator=g), torch.randn(world * MB, OUT, generator=g))
            for _ in range(GAS)
        ]
        for _ in range(STEPS)
    ]


def _optimizer(kind: str, dense: list, experts: list) -> torch.optim.Optimizer:
    groups = [{"params": dense}, {"params": experts, "lr": 0.2 if kind == "sgd" else 0.03}]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(groups, lr=0.05, weight_decay=0.1)


def _loss(dense: nn.Linear, expert: nn.Linear, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(expert(torch.tanh(dense(x))), y)


def reference(cfg: dict, world: int, ep: int) -> tuple[dict, list[dict], float]:
    """One process holding the dense layer and all ``ep`` experts: each rank's share of the batch goes
    through its own expert, the loss is the mean over ranks (data parallelism's average). Returns the
    weights and the last step's gradient norm (before clipping)."""
    dense, experts = _dense(), [_expert(e) for e in range(ep)]
    params = [*dense.parameters(), *(p for e in experts for p in e.parameters())]
    opt = _optimizer(cfg["optim"], list(dense.parameters()), params[2:])
    for step in _data(world):
        for x, y in step:
            loss = sum(
                _loss(dense, experts[r % ep], x[r * MB : (r + 1) * MB], y[r * MB : (r + 1) * MB])
                for r in range(world)
            )
            (loss / world / GAS).backward()
        norm = nn.utils.clip_grad_norm_(params, cfg.get("clip") or float("inf")).item()
        opt.step()
        opt.zero_grad()
    weights = [{k: v.detach().clone() for k, v in e.state_dict().items()} for e in experts]
    return {k: v.detach().clone() for k, v in dense.state_dict().items()}, weights, norm


def expert_data_groups(world: int, ep: int) -> list:
    """``edp[e]``: the ranks holding expert ``e`` (every rank makes every group, in the same order)."""
    return [dist.new_group([r for r in range(world) if r % ep == e]) for e in range(ep)]


def train(rank: int, world: int, ep: int, edp_group, cfg: dict, wire: bool = True) -> dict:
    """ZeRO on the real ranks; the weights this rank ends with (dense, its own expert) and the norm."""
    dense, expert = _dense(), _expert(rank % ep)
    opt = _optimizer(cfg["optim"], list(dense.parameters()), list(expert.parameters()))
    keys = ("reduce_bucket_size", "overlap_comm", "contiguous_gradients", "reduce_scatter")
    options = ZeroOptions(
        stage=cfg["stage"], clip_grad=cfg.get("clip", 0.0), **{k: cfg[k] for k in keys if k in cfg}
    )
    zero = ZeroOptimizer(opt, options, partition_groups={1: edp_group} if wire else None)
    for step in _data(world):
        for m, (x, y) in enumerate(step):
            zero.set_boundary(m == GAS - 1)
            zero.backward(
                _loss(dense, expert, x[rank * MB : (rank + 1) * MB], y[rank * MB : (rank + 1) * MB]) / GAS
            )
        assert zero.step()
    full = zero.full_fp32_param(expert.weight)  # collective over the expert's own group
    return {
        "dense": {k: v.detach().clone() for k, v in dense.state_dict().items()},
        "expert": {k: v.detach().clone() for k, v in expert.state_dict().items()},
        "full_expert_weight_error": (full - expert.weight.detach()).abs().max().item(),
        "norm": zero.global_grad_norm,
        "expert_partition": zero.groups[1].layout.dp,
    }


CONFIGS = [
    {"stage": 1, "optim": "adamw"},
    {"stage": 2, "optim": "sgd", "clip": 0.05},
    {"stage": 1, "optim": "sgd", "clip": 0.05, "reduce_scatter": False},
    {
        "stage": 2,
        "optim": "adamw",
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 20,
    },
]


def run(rank: int, world: int, eps: list[int]) -> list[dict]:
    """Every config at every ``ep`` in ``eps``, then the unwired run (experts over the world group)."""
    out = []
    for ep in eps:
        edp = expert_data_groups(world, ep)[rank % ep]
        for cfg in CONFIGS:
            out.append({"ep": ep, "cfg": cfg, **train(rank, world, ep, edp, cfg)})
        out.append(
            {"ep": ep, "cfg": CONFIGS[1], "unwired": True, **train(rank, world, ep, edp, CONFIGS[1], False)}
        )
    return out
