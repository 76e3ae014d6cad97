"""A rank of a multi-host job: records where it runs, then all-reduces step after step, as training would.

Usage: hosts_rank.py [--local_rank=N] OUT STEPS [FAULT RANK STEP]. Each rank writes OUT/rank<R>.json (its
topology and host) and OUT/progress<R> (the last step done). FAULT, done by rank RANK at step STEP:
``raise`` (an exception while the others wait in the next all-reduce) or ``hang`` (sleeps forever outside any
collective, as a rank stuck in a deadlock would).
"""

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from ds_launch import init_distributed

args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
out, steps = Path(args[0]), int(args[1])
fault, fault_rank, fault_step = (args[2], int(args[3]), int(args[4])) if len(args) > 2 else ("", -1, -1)
torch.set_num_threads(1)
topo = init_distributed(backend="gloo")
print(f"startup: {topo.describe()}", file=sys.stderr, flush=True)  # as ds_engine.initialize logs it
record = {
    "rank": topo.rank,
    "host": socket.gethostname(),
    "local_rank": topo.local_rank,
    "local_world_size": topo.local_world_size,
    "env_local_rank": os.environ.get("LOCAL_RANK"),
    "env_local_world_size": os.environ.get("LOCAL_WORLD_SIZE"),
    "world_size": topo.world_size,
    "master_addr": topo.master_addr,
    "master_port": topo.master_port,
    "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
    "interface": topo.interface,
}
(out / f"rank{topo.rank}.json.part").write_text(json.dumps(record))
(out / f"rank{topo.rank}.json.part").rename(out / f"rank{topo.rank}.json")  # whole, for the tests that poll for it
for step in range(steps):
    if topo.rank == fault_rank and step == fault_step:
        print(f"rank {topo.rank} on {record['host']}: {fault} at step {step}", file=sys.stderr, flush=True)
        if fault == "raise":
            raise RuntimeError(f"injected failure at step {step}")
        if fault == "hang":
            time.sleep(3600)
    x = torch.ones(1024)
    dist.all_reduce(x)
    assert x[0].item() == topo.world_size
    (out / f"progress{topo.rank}").write_text(str(step))
    time.sleep(0.05)
