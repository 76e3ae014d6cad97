"""A rank that records where it runs and what its launcher gave it (no torch: fast). Usage: where_rank.py OUT."""

import json
import os
import socket
import sys
from pathlib import Path

keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")  # fmt: skip
record = {k: os.environ.get(k) for k in keys}
record.update(host=socket.gethostname(), argv=sys.argv[1:])
out = Path([a for a in sys.argv[1:] if not a.startswith("--local_rank")][0])
(out / f"where{os.environ['RANK']}.json").write_text(json.dumps(record))
