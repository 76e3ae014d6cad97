"""One rank fails after the first all-reduce; the others keep calling collectives, as training would.

Usage: fail_after_collective.py [--local_rank=N] RANK exit|kill. The failing rank leaves through
sys.exit(3), so init_distributed's at-exit teardown runs, or is SIGKILLed; its peers then fail in
their next all-reduce ("Connection closed by peer") and exit 1 within milliseconds.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from ds_launch import init_distributed

fail_rank, how = int(sys.argv[-2]), sys.argv[-1]
torch.set_num_threads(1)
topo = init_distributed(backend="gloo")
dist.all_reduce(torch.ones(4))
if topo.rank == fail_rank:
    print(f"rank {topo.rank} fails now ({how})", file=sys.stderr, flush=True)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    dist.all_reduce(torch.ones(4))
    time.sleep(0.01)
