"""The rank folders under ``nvme_path/<name>/``: ds's mark on the ones it made, and the removal of those of
ranks a run no longer has.

A checkpoint saved at N ranks may resume at fewer; the swap folders of ranks >= the new world size are
never read again (swap files are scratch), so the disk space they hold would leak. Every rank removes
them when its ``SwapFolder`` is made (the process group is up: the world size is known), so a path that
is local to each node is cleared on every node, and a shared one by whichever rank comes first.

Two running jobs must not share an ``nvme_path`` (each empties its own rank folders at start, so they would
clear each other's rank 0 anyway), but one may be pointed at another's path by mistake, and other programs
may keep folders there. So only a folder that ds made is removed: it holds the marker file ``MARKER``,
which the rank that uses the folder keeps open with a shared ``flock`` for as long as its swap lives.
Removal takes the exclusive lock without waiting first, so a folder a live process still uses (another
job, of any world size) is left alone, as is any folder without the marker (another program's, or one
from a ds before the marker: removed by hand). Locks are advisory and seen on one host only (on a file
system shared between hosts, another host's live job is not seen).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil

__all__ = ["MARKER", "hold_marker", "remove_vanished_ranks"]

logger = logging.getLogger("ds_zero")

MARKER = ".ds-swap-folder"
_RANK = re.compile(r"rank(\d{5,})")


def hold_marker(folder: str) -> int:
    """Create ``folder``'s marker and hold it with a shared lock; the returned descriptor keeps the lock (closing
    it, or the process ending, releases it)."""
    fd = os.open(os.path.join(folder, MARKER), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def remove_vanished_ranks(root: str, world: int) -> list[str]:
    """Remove the folders ``root/rankNNNNN`` with NNNNN >= ``world`` that ds marked and no live process holds;
    the names removed."""
    removed = []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return removed
    for name in names:
        m = _RANK.fullmatch(name)
        if m is None or int(m.group(1)) < world:
            continue
        folder = os.path.join(root, name)
        try:
            fd = os.open(os.path.join(folder, MARKER), os.O_RDONLY)
        except OSError:  # no marker (not a folder ds made) or already removed by another rank
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live process uses it: another job on this nvme_path
            os.close(fd)
            continue
        try:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)
        removed.append(name)
        logger.info(
            "removed %s: swap folder of rank %d, not in this run of %d ranks", folder, int(m.group(1)), world
        )
    return removed
