"""A rank that prints many JSON lines to stdout and stderr as fast as it can (no torch: fast).

Usage: chatty_rank.py [--local_rank=N] LINES. Lines of different lengths, so that glued or split ones cannot parse.
"""

import json
import os
import sys

rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
for i in range(int(sys.argv[-1])):
    payload = "x" * (i % 97)
    print(json.dumps({"rank": rank, "i": i, "pad": payload}), flush=True)
    if i % 10 == 0:
        print(json.dumps({"rank": rank, "i": i, "stream": "stderr"}), file=sys.stderr)
