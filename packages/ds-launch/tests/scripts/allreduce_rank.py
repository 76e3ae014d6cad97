"""A rank that joins through init_distributed and completes one gloo all-reduce."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from ds_launch import init_distributed

torch.set_num_threads(1)
topo = init_distributed(backend="gloo")
x = torch.tensor([float(topo.rank + 1)])
dist.all_reduce(x)
again = init_distributed()
Path(sys.argv[1], f"rank{topo.rank}.json").write_text(
    json.dumps(
        {
            "rank": topo.rank,
            "local_rank": topo.local_rank,
            "world_size": topo.world_size,
            "local_world_size": topo.local_world_size,
            "master_addr": topo.master_addr,
            "master_port": topo.master_port,
            "source": topo.source,
            "backend": topo.backend,
            "device": str(topo.device),
            "sum": x.item(),
            "idempotent": again is topo,
        }
    )
)
dist.destroy_process_group()
