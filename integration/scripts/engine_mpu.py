"""Train with a Megatron-style ``mpu``: the engine must reduce over the data-parallel group only, and
clip by the norm over the model-parallel group too.

Ranks are laid out as ``rank = dp_rank * MP + mp_rank``. Each model-parallel rank holds a different
model (its own seed, marked ``tensor_model_parallel`` as tensor-parallel shards are), so an all-reduce
over the wrong group would mix the models, and the clipping norm must sum over every shard. After
training, every rank compares its weights with plain torch that trains all the shards on one process,
each on its data-parallel group's whole batch, and writes the largest difference to ``OUT/rank{R}.json``.
Usage: ds-launch --num_procs W engine_mpu.py OUT  (W a multiple of 2)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ds_engine
import torch
import torch.distributed as dist

MP = 2
GROUP_BATCH = 8  # per data-parallel group and optimizer step
STEPS = 4
LR = 1e-2
CLIP = 0.05  # small enough that every step clips
CONFIGS = {
    f"stage{stage}-gas{gas}": {
        "train_batch_size": GROUP_BATCH,
        "gradient_accumulation_steps": gas,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
        "gradient_clipping": CLIP,
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 100,
            "allgather_bucket_size": 100,
            # stage 3 partitions every parameter of this small model (the default keeps < 1e5 whole)
            **({"stage3_param_persistence_threshold": 0} if stage == 3 else {}),
        },
    }
    for stage, gas in ((0, 1), (1, 2), (2, 1), (3, 2))
}


class MPU:
    """The model-parallel unit DeepSpeed's initialize(mpu=...) accepts (Megatron's method names)."""

    def __init__(self, mp: int) -> None:
        world, rank = dist.get_world_size(), dist.get_rank()
        self.mp, self.dp = mp, world // mp
        self.mp_rank, self.dp_rank = rank % mp, rank // mp
        # every rank creates every group, in the same order (torch.distributed requires it)
        dp_groups = [dist.new_group([d * mp + m for d in range(self.dp)]) for m in range(mp)]
        mp_groups = [dist.new_group([d * mp + m for m in range(mp)]) for d in range(self.dp)]
        self._dp_group, self._mp_group = dp_groups[self.mp_rank], mp_groups[self.dp_rank]

    def get_data_parallel_group(self):
        return self._dp_group

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return self.dp_rank

    def get_model_parallel_group(self):
        return self._mp_group

    def get_model_parallel_world_size(self) -> int:
        return self.mp

    def get_model_parallel_rank(self) -> int:
        return self.mp_rank


def model(mp_rank: int) -> torch.nn.Module:
    torch.manual_seed(100 + mp_rank)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    for p in net.parameters():
        p.tensor_model_parallel = True
    return net


def data(step: int, mp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * mp_rank + step)
    return torch.randn(GROUP_BATCH, 6, generator=g), torch.randint(0, 3, (GROUP_BATCH,), generator=g)


def train(cfg: dict, mpu: MPU) -> dict[str, torch.Tensor]:
    engine, *_ = ds_engine.initialize(model=model(mpu.mp_rank), config=cfg, mpu=mpu)
    mbs, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    for step in range(STEPS):
        x, y = data(step, mpu.mp_rank)
        for micro in range(gas):
            lo = (micro * mpu.dp + mpu.dp_rank) * mbs  # this rank's slice of its group's batch
            engine.backward(torch.nn.functional.cross_entropy(engine(x[lo : lo + mbs]), y[lo : lo + mbs]))
            engine.step()
    # stage 3 holds partitions only: its optimizer gathers the full weights
    return getattr(engine.optimizer, "module_state_dict", engine.module.state_dict)()


def reference(mp_rank: int) -> torch.nn.Module:
    """Plain torch on one process: every shard on its group's whole batch, clipped by their joint norm."""
    nets = [model(m) for m in range(MP)]
    opts = [torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.01) for net in nets]
    for step in range(STEPS):
        for m, net in enumerate(nets):
            x, y = data(step, m)
            torch.nn.functional.cross_entropy(net(x), y).backward()
        grads = [p.grad for net in nets for p in net.parameters()]
        norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads)).item()
        for g in grads:  # docs/design.md §5: coefficient max / (norm + 1e-6) when below 1
            g.mul_(min(1.0, CLIP / (norm + 1e-6)))
        for opt in opts:
            opt.step()
            opt.zero_grad()
    return nets[mp_rank]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--local_rank", type=int, default=-1)  # ds-launch passes it, DeepSpeed-style
    out = parser.parse_args().out
    ds_engine.init_distributed(dist_backend="gloo")
    mpu = MPU(MP)
    want = reference(mpu.mp_rank).state_dict()
    report = {"mp_rank": mpu.mp_rank, "dp_rank": mpu.dp_rank, "max_abs_diff": {}}
    for name, cfg in CONFIGS.items():
        got = train(cfg, mpu)
        report["max_abs_diff"][name] = max((got[k] - want[k]).abs().max().item() for k in want)
    report["first_weight"] = want["0.weight"][0, 0].item()
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
