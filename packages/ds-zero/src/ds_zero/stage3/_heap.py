"""Returning freed heap to the OS at two points where stage 3 has just freed a lot (glibc only).

glibc serves allocations below its mmap threshold (which rises, up to 32 MiB, as large blocks are freed)
from its heap, and keeps freed heap mapped for reuse: freed memory stays in the resident set. Stage 3
frees a lot at two points, and what it frees there is not what it allocates next, so the heap would
only grow: when the optimizer takes over a model built inside ``zero.Init`` (every construction chunk
and the whole-parameter temporaries of the move into the flat partitions: ~2.5 bytes of resident heap
per partition byte measured with ``tools/bench/trace_stage3_rss.py``), and after each step (the gathered
weights, full gradients, reduction buckets and optimizer temporaries of the step, of many sizes and
lifetimes). ``malloc_trim(0)`` there hands the free pages back (``madvise``), so the next step's peak
starts from the live set instead of the last step's heap. It costs the page faults of memory reused
later; the engine's allocation pattern is unchanged. ``DS_ZERO_MALLOC_TRIM=0`` turns it off; off glibc
it does nothing.

After a step it runs only when glibc holds more than ``DS_ZERO_MALLOC_TRIM_MIN_MIB`` (default 64) MiB free
(``mallinfo2``): below that, keeping the pages costs at most that much resident memory, while handing them
back and faulting them in again cost a small model's step more than its forward and backward (the
Trainer's GPT-2 of docs/benchmarks.md: its ZeRO-3 step took about twice as long trimming every step, on a
loaded machine). A model whose step frees more is trimmed every step, as before.

With the optimizer on NVMe the step streams hundreds of sub-groups, each with its own temporaries (the
fp32 gradient, the update's), 16 MiB apiece, and the heap grew by them through the step until the trim
at its end: ~8 bytes per parameter above the live set at 0.28B parameters (``tools/bench/bench_largest_fit.py``
and a sampler of the step's RSS, issue 36), which at 3B would pass the machine's memory. So there the
optimizer fixes glibc's mmap threshold at ``STREAMED_MMAP_THRESHOLD`` (``fix_mmap_threshold``, called by
``ZeroStage3Optimizer`` when ``optimizer_nvme`` is set, logged once at INFO): every block
of that size or more is mapped for itself and unmapped when freed, whatever was freed before; the cost
is the page faults of each such block, small beside the disk I/O of the same sub-group.
"""

from __future__ import annotations

import ctypes
import logging

from ds_config import env_flag, env_number

__all__ = ["fix_mmap_threshold", "release_freed_heap"]

logger = logging.getLogger("ds_zero")

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
STREAMED_MMAP_THRESHOLD = 1 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"
    )]  # fmt: skip


_trim = _info = _mallopt = None
try:
    _libc = ctypes.CDLL("libc.so.6")
    _mallopt = _libc.mallopt
    _mallopt.argtypes, _mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _trim = _libc.malloc_trim
    _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
    _info = getattr(_libc, "mallinfo2", None)  # glibc 2.33+
    if _info is not None:
        _info.argtypes, _info.restype = [], _MallInfo2
except (OSError, AttributeError):  # not glibc
    pass

trims = 0  # calls that reached glibc (observed by the tests)
mmap_threshold: int | None = None  # what fix_mmap_threshold set (observed by the tests)


def free_heap_bytes() -> int | None:
    """Bytes glibc holds free in its heaps (every arena), or None where it cannot tell."""
    return int(_info().fordblks) if _info is not None else None


def step_threshold() -> int:
    """The free heap, in bytes, above which the trim after a step runs (``DS_ZERO_MALLOC_TRIM_MIN_MIB``)."""
    return int(env_number("DS_ZERO_MALLOC_TRIM_MIN_MIB", 64) * 2**20)


def release_freed_heap(at_least: int = 0) -> bool:
    """``malloc_trim(0)``: give the heap glibc keeps free back to the OS, if more than ``at_least`` bytes
    are free (always where glibc cannot tell). True when it ran."""
    global trims
    if _trim is None or not env_flag("DS_ZERO_MALLOC_TRIM", True):
        return False
    free = free_heap_bytes() if at_least > 0 else None
    if free is not None and free <= at_least:
        return False
    _trim(0)
    trims += 1
    return True


def fix_mmap_threshold(nbytes: int = STREAMED_MMAP_THRESHOLD) -> bool:
    """``mallopt(M_MMAP_THRESHOLD, nbytes)``: blocks of ``nbytes`` and more are mapped and unmapped one by
    one from now on (glibc no longer raises the threshold as large blocks are freed). Process-wide; off
    glibc, or with ``DS_ZERO_MALLOC_TRIM=0``, it does nothing. True when it was set."""
    global mmap_threshold
    if _mallopt is None or not env_flag("DS_ZERO_MALLOC_TRIM", True):
        return False
    if not _mallopt(M_MMAP_THRESHOLD, nbytes):
        return False
    if mmap_threshold != nbytes:
        logger.info(
            "ds-zero: glibc's mmap threshold fixed at %d bytes for this process (mallopt M_MMAP_THRESHOLD): "
            "the optimizer step streamed from nvme frees its per-sub-group temporaries to the OS instead of "
            "keeping them as heap (DS_ZERO_MALLOC_TRIM=0 turns it off)",
            nbytes,
        )
    mmap_threshold = nbytes
    return True
