"""Watch one run's owner; when it dies without closing its hosts (a SIGKILLed test, a crashed xdist worker),
tear the hosts down. Started detached by :class:`hosts.Cluster`: ``python _reaper.py PREFIX``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hosts._netns import OWNER_FILE, owner_alive, state_root, teardown  # noqa: E402

POLL_S = 0.5


def main(prefix: str) -> None:
    owner_file = state_root() / prefix / OWNER_FILE
    record = json.loads(owner_file.read_text())
    while owner_file.exists():  # the owner's close() removes it: nothing left to do
        if not owner_alive(record):
            teardown(prefix)
            return
        time.sleep(POLL_S)


if __name__ == "__main__":
    main(sys.argv[1])
