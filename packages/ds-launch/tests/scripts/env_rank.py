"""A rank that records what the launcher gave it, then misbehaves on request (no torch: fast)."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, default=None)
p.add_argument("--out", required=True)
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--code", type=int, default=3)
p.add_argument("--kill-rank", type=int, default=-1)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--grandchild", action="store_true")
p.add_argument("--trap-term", action="store_true")
p.add_argument("--ignore-term", action="store_true")
args, rest = p.parse_known_args()

rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
out = Path(args.out)
keys = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
)
record = {k: os.environ.get(k) for k in keys}
record.update(argv=sys.argv[1:], local_rank_arg=args.local_rank, rest=rest, pid=os.getpid())
if args.trap_term:

    def on_term(signum, frame):
        (out / f"term{rank}").write_text("SIGTERM")
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if args.grandchild:
    # A process of the rank's own (like a data-loader worker) that must not outlive the job.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *sys.argv[1:]])
    record["grandchild"] = child.pid
(out / f"rank{rank}.json.part").write_text(json.dumps(record))
(out / f"rank{rank}.json.part").rename(out / f"rank{rank}.json")  # whole, for the tests that poll for it
if rank == args.fail_rank:
    time.sleep(0.3)
    sys.exit(args.code)
if rank == args.kill_rank:
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
deadline = time.monotonic() + args.sleep
while time.monotonic() < deadline:
    time.sleep(0.05)
