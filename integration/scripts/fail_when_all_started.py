"""Every rank records that it started; the last rank exits 3 once all have, the others wait 60 s (no torch).
Usage: fail_when_all_started.py OUT [marker]: a failure that must stop ranks known to be running."""

import os
import sys
import time
from pathlib import Path

out = Path([a for a in sys.argv[1:] if not a.startswith("--local_rank")][0])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
(out / f"started{rank}").write_text(os.environ.get("LOCAL_RANK", ""))
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if rank == world - 1 and all((out / f"started{r}").exists() for r in range(world)):
        sys.exit(3)
    time.sleep(0.05)
