"""Run under mpirun across namespace test hosts (test_zero_shm_hosts.py): which groups take the shared-memory
transport. Ranks 0, 1 on one host, 2, 3 on another; every rank prints one JSON line."""

import json
import os
import socket

import torch.distributed as dist
from ds_zero import _transport

os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")  # the test hosts' link (ds_launch would choose it)
rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
# every group is made on every rank, in the same order, as torch.distributed requires
groups = {name: dist.new_group(ranks) for name, ranks in
          {"world": None, "node0": [0, 1], "node1": [2, 3], "across": [1, 2]}.items()}  # fmt: skip
taken = {}
for name, group in groups.items():
    if group is None:
        group = dist.group.WORLD
    if dist.get_rank(group) < 0:
        continue  # not a member
    made = _transport.enable(None if name == "world" else group)
    taken[name] = made.kind if made is not None else "torch"
print(json.dumps({"rank": rank, "host": socket.gethostname(), "taken": taken}), flush=True)
dist.destroy_process_group()
