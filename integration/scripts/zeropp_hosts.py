"""ZeRO++ through the engine across hosts: plain ZeRO-3, hpZ, and hpZ with int8 weights and 4-bit gradients.

Rank 0 writes JSON: each config's losses, and per rank its host with the ranks of the groups ds-engine
made for it (hpZ, the host, across hosts) and how many elements its backward gathered from the secondary
partitions. Usage: ds-launch --hostfile H zeropp_hosts.py OUT.json
"""

from __future__ import annotations

import json
import socket
import sys

import ds_engine
import torch
import torch.distributed as dist
from engine_parity import configs, data, model

BASE = configs()["stage3-fp32-gas1"]
ZERO = {"stage": 3, "reduce_bucket_size": 200, "stage3_param_persistence_threshold": 0,
        "stage3_max_reuse_distance": 0}  # fmt: skip
CASES = {
    "plain": {},
    "hpz": {"zero_hpz_partition_size": 2},
    "zeropp": {
        "zero_hpz_partition_size": 2,
        "zero_quantized_weights": True,
        "zero_quantized_gradients": True,
    },
}


def ranks(group) -> list[int] | None:
    return None if group is None else dist.get_process_group_ranks(group)


def train(extra: dict, steps: int) -> tuple[list[float], dict]:
    cfg = {**BASE, "zero_optimization": {**ZERO, **extra}}
    engine, *_ = ds_engine.initialize(model=model(), config=cfg)
    rank, world, mbs = dist.get_rank(), dist.get_world_size(), engine.train_micro_batch_size_per_gpu()
    losses = []
    for step in range(steps):
        x, y = data(step)
        loss = torch.nn.functional.cross_entropy(engine(x[rank * mbs : (rank + 1) * mbs]).float(),
                                                 y[rank * mbs : (rank + 1) * mbs])  # fmt: skip
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    zero = engine.optimizer
    groups = zero.host_groups
    mine = {"host": socket.gethostname(), "hpz": ranks(groups.hpz), "local": ranks(groups.local),
            "cross": ranks(groups.cross), "secondary_numel": zero.params.secondary_numel}  # fmt: skip
    every = [None] * world
    dist.all_gather_object(every, mine)
    return losses, every


def main() -> None:
    out = sys.argv[1]
    ds_engine.init_distributed()
    result = {}
    for name, extra in CASES.items():
        losses, every = train(extra, 6)
        result[name] = {"losses": losses, "ranks": every}
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
