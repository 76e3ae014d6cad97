"""Returning freed heap to the OS at two points where stage 3 has just freed a lot (glibc only).

glibc serves allocations below its mmap threshold (which rises, up to 32 MiB, as large blocks are freed)
from its heap, and keeps freed heap mapped for reuse: freed memory stays in the resident set. Stage 3
frees a lot at two points, and what it frees there is not what it allocates next, so the heap would
only grow: when the optimizer takes over a model built inside ``zero.Init`` (every construction chunk
and the whole-parameter temporaries of the move into the flat partitions: ~2.5 bytes of resident heap
per partition byte measured with ``tools/trace_stage3_rss.py``), and after each step (the gathered
weights, full gradients, reduction buckets and optimizer temporaries of the step, of many sizes and
lifetimes). ``malloc_trim(0)`` there hands the free pages back (``madvise``), so the next step's peak
starts from the live set instead of the last step's heap. It costs the page faults of memory reused
later; the engine's allocation pattern is unchanged. ``DS_ZERO_MALLOC_TRIM=0`` turns it off; off glibc
it does nothing.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["release_freed_heap"]

_trim = None
try:
    _trim = ctypes.CDLL("libc.so.6").malloc_trim
    _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
except (OSError, AttributeError):  # not glibc
    pass

trims = 0  # calls that reached glibc (observed by the tests)


def release_freed_heap() -> bool:
    """``malloc_trim(0)``: give the heap glibc keeps free back to the OS. True when it ran."""
    global trims
    if _trim is None or os.environ.get("DS_ZERO_MALLOC_TRIM", "1") == "0":
        return False
    _trim(0)
    trims += 1
    return True
