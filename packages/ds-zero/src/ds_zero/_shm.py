"""ZeRO's collectives through shared memory, for gloo ranks on one host (ds-launch's and torchrun's
single-node jobs). "One host" is what the ranks report (hostname and boot id, ``host_identity``), never
inferred from a file they can all open.

gloo moves a same-host tensor through TCP loopback; here every rank maps one file in ``/dev/shm`` and
the data crosses memory once each way. Measured on a 2-core machine (tools/bench/bench_zero_mpi.py; no record
kept, the notes are in git: git show af730fc:docs/benchmarks/ds-zero.md), it was several times faster than
gloo at 4 ranks.

Layout of the mapping: a header (rank 0's token, every rank's pid), one 64-byte flag per rank, then two
regions of ``world`` slots of ``CHUNK`` bytes. A collective moves its tensors in rounds of at most
``CHUNK`` bytes per rank, alternating regions; a round is: write into my slot, barrier, read the slots I
need (all-reduce: sum my share of the round into my slot, barrier, read everyone's share). A region is
written again two rounds later, after a barrier every rank passes only once done reading it.

The barrier is a sequence number per rank in the flags, polled with ``sched_yield`` then short sleeps: it
relies on x86-64's ordering of plain stores (data before flag), so other machines keep gloo. A waiting rank
checks that its peers' processes still exist, and gives up after ``TIMEOUT_S``.

Every sum is done once, by the rank that owns that share, in a fixed rank order, and copied to the
others: every rank ends with the same bits.
"""

from __future__ import annotations

import mmap
import os
import platform
import secrets
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ._host_transport import HostTransport, Work

__all__ = ["CHUNK", "ShmTransport", "enable"]

CHUNK = 1 << 20  # bytes per rank per round (measured fastest of 1, 4 and 16 MiB; tests lower it)
SHM_DIR = "/dev/shm"
TIMEOUT_S = 1800.0  # torch.distributed's default collective timeout
_HEADER = 4096  # token (16 bytes), then one int64 pid per rank
_FLAG = 64  # bytes per rank's flag: one cache line each

Piece = tuple[torch.Tensor, int]  # a 1-D tensor and the rank it concerns (root, or owner)


def _layout(world: int) -> tuple[int, int, int]:
    """(offset of the flags, offset of the regions, total bytes) of a ``world``-rank mapping."""
    flags = _HEADER + 8 * world
    regions = -(-(flags + _FLAG * world) // 4096) * 4096
    return flags, regions, regions + 2 * world * CHUNK


class ShmTransport(HostTransport):
    """Collectives over one shared mapping, run in launch order by one worker thread."""

    kind = "shm"
    dtypes = frozenset({torch.float32, torch.float64, torch.bfloat16, torch.float16})

    def __init__(self, mm: mmap.mmap, world: int, rank: int, pids: list[int]) -> None:
        self._mm = mm
        self.world, self.rank = world, rank
        self._pids = pids
        flags_at, self._regions_at, _ = _layout(world)
        self._flags = memoryview(mm)[flags_at : flags_at + _FLAG * world].cast("q")
        self._seq = 0  # barriers passed
        self._round = 0  # rounds run (selects the region)
        super().__init__()

    # -- the four collectives ---------------------------------------------------------------------
    def all_reduce(self, tensors: Sequence[torch.Tensor]) -> Work:
        """Sum each tensor across ranks in place."""
        flat = [t.view(-1) for t in tensors]
        return self.submit([(tensors, lambda: self._run_rounds([(t, -1) for t in flat], self._all_reduce))])

    def reduce(self, pieces: Sequence[tuple[torch.Tensor, int]], rank: int) -> Work:
        """Sum each ``(tensor, root)`` across ranks into ``root``'s tensor (the others' stay as they were)."""
        flat = [(t.view(-1), r) for t, r in pieces]
        return self.submit([(pieces, lambda: self._run_rounds(flat, self._reduce))])

    def broadcast(self, pieces: Sequence[tuple[torch.Tensor, int]]) -> Work:
        """Fill each ``(tensor, root)`` on every rank with ``root``'s tensor."""
        flat = [(t.view(-1), r) for t, r in pieces]
        return self.submit([(pieces, lambda: self._run_rounds(flat, self._broadcast))])

    def all_gather(self, span: torch.Tensor) -> Work:
        """``span`` is ``world`` equal parts, rank r's part filled on rank r: fill every part everywhere."""
        return self.broadcast(list(zip(span.view(-1).chunk(self.world), range(self.world))))

    # -- rounds ---------------------------------------------------------------------------------------
    def _run_rounds(self, pieces: list[Piece], run: Callable[[list[torch.Tensor], list, int], None]) -> None:
        whole = torch.frombuffer(self._mm, dtype=torch.uint8)  # dropped when the collective returns
        for packed, used in _rounds(pieces, CHUNK):
            dtype = packed[0][0].dtype
            at = self._regions_at + (self._round % 2) * self.world * CHUNK
            self._round += 1
            slots = [whole[at + r * CHUNK : at + (r + 1) * CHUNK].view(dtype) for r in range(self.world)]
            run(slots, packed, used)

    def _all_reduce(self, slots: list[torch.Tensor], packed: list, used: int) -> None:
        me, world = self.rank, self.world
        for t, _, off in packed:
            slots[me][off : off + t.numel()].copy_(t)
        self._barrier()
        share = -(-used // world)
        bounds = [(min(r * share, used), min((r + 1) * share, used)) for r in range(world)]
        lo, hi = bounds[me]
        if lo < hi:
            acc = slots[me][lo:hi]
            for r in range(world):
                if r != me:
                    acc.add_(slots[r][lo:hi])
        self._barrier()
        for t, _, off in packed:
            end = off + t.numel()
            for r, (lo, hi) in enumerate(bounds):
                a, z = max(lo, off), min(hi, end)
                if a < z:
                    t[a - off : z - off].copy_(slots[r][a:z])

    def _reduce(self, slots: list[torch.Tensor], packed: list, used: int) -> None:
        me = self.rank
        for t, root, off in packed:
            if root != me:
                slots[me][off : off + t.numel()].copy_(t)
        self._barrier()
        for t, root, off in packed:
            if root == me:
                for r in range(self.world):
                    if r != me:
                        t.add_(slots[r][off : off + t.numel()])

    def _broadcast(self, slots: list[torch.Tensor], packed: list, used: int) -> None:
        me = self.rank
        for t, root, off in packed:
            if root == me:
                slots[me][off : off + t.numel()].copy_(t)
        self._barrier()
        for t, root, off in packed:
            if root != me:
                t.copy_(slots[root][off : off + t.numel()])

    # -- the barrier ------------------------------------------------------------------------------------
    def _barrier(self) -> None:
        """Wait until every rank has reached this barrier (the same count of barriers on every rank)."""
        self._seq += 1
        seq, flags = self._seq, self._flags
        flags[self.rank * (_FLAG // 8)] = seq
        watch = [r * (_FLAG // 8) for r in range(self.world) if r != self.rank]
        spins = 0
        deadline = 0.0
        while True:
            if all(flags[i] >= seq for i in watch):
                return
            spins += 1
            if spins < 64:
                os.sched_yield()
                continue
            time.sleep(5e-5)
            if spins % 4096 == 0:  # about every quarter second
                now = time.monotonic()
                deadline = deadline or now + TIMEOUT_S
                self._check_peers(now > deadline)

    def _check_peers(self, timed_out: bool) -> None:
        for r, pid in enumerate(self._pids):
            if r != self.rank and not _alive(pid):
                raise RuntimeError(
                    f"rank {r} of the group (pid {pid}) exited during a shared-memory collective"
                )
        if timed_out:
            raise TimeoutError(f"a shared-memory collective waited more than {TIMEOUT_S:.0f} s for its peers")


def _rounds(pieces: list[Piece], cap_bytes: int) -> Iterator[tuple[list[tuple[torch.Tensor, int, int]], int]]:
    """Pack ``pieces`` in order into rounds of at most ``cap_bytes`` per slot, splitting a piece that does
    not fit; one dtype per round. Yields ``([(part, rank, element offset in the slot)], elements used)``,
    the same on every rank."""
    packed: list[tuple[torch.Tensor, int, int]] = []
    used = 0
    dtype = None
    for t, r in pieces:
        if t.dtype != dtype and packed:
            yield packed, used
            packed, used = [], 0
        dtype = t.dtype
        cap = cap_bytes // t.element_size()
        start = 0
        while start < t.numel():
            if used == cap:
                yield packed, used
                packed, used = [], 0
            n = min(t.numel() - start, cap - used)
            packed.append((t[start : start + n], r, used))
            used += n
            start += n
    if packed:
        yield packed, used


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (an exited one that its parent has not reaped yet does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


def _local_reason(group: dist.ProcessGroup | None) -> str | None:
    """Why this rank cannot use shared memory for ``group`` (None when it may try)."""
    if str(dist.get_backend(group)) != "gloo":
        return "the group's backend is not gloo"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "the shared-memory barrier relies on x86-64's store ordering"
    if not os.access(SHM_DIR, os.W_OK):
        return f"{SHM_DIR} is not writable"
    return None


def host_identity() -> tuple[str, str]:
    """What this host reports itself as: its hostname and the kernel's boot id. Two ranks share a host only
    when both agree; a /dev/shm (or any file) that both can open proves nothing (a shared filesystem, a
    tmpfs mounted into containers of different machines), and a hostname alone repeats across machines."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return socket.gethostname(), boot


def _one_host(group: dist.ProcessGroup | None) -> str | None:
    """None when every rank of ``group`` reports the same host, else why not (the same on every rank)."""
    reported: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(reported, host_identity(), group=group)
    if len(set(reported)) == 1:
        return None
    by_host: dict[str, list[int]] = {}
    for rank, (hostname, _boot) in enumerate(reported):
        by_host.setdefault(hostname, []).append(rank)
    hosts = "; ".join(f"{name}: ranks {', '.join(map(str, ranks))}" for name, ranks in by_host.items())
    return f"the group's ranks are on {len(set(reported))} hosts ({hosts}); shared memory joins ranks of one host"


def enable(group: dist.ProcessGroup | None, agree: Callable[[bool, Any], bool]) -> ShmTransport | str:
    """A shared-memory transport for ``group`` when every rank reports the same host (``host_identity``)
    and can map one file that its rank 0 made, else why not, as this rank sees it. A collective over
    ``group`` (four small ones: qualify, same host, mapped, peers visible)."""
    reason = _local_reason(group)
    if not agree(reason is None, group):
        return reason or "this rank qualifies, another does not"
    apart = _one_host(group)
    if apart is not None:
        return apart
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    size = _layout(world)[2]
    name = torch.zeros(512, dtype=torch.uint8)
    token = b""
    if rank == 0:
        try:
            fd, path = tempfile.mkstemp(prefix="ds-zero-", dir=SHM_DIR)
            try:
                os.ftruncate(fd, size)
                token = secrets.token_bytes(16)
                os.pwrite(fd, token, 0)
            finally:
                os.close(fd)
            raw = token + path.encode()
            name[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
        except OSError:
            pass
    root = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast(name, src=root, group=group)
    raw = bytes(name.tolist()).rstrip(b"\0")
    token, path = raw[:16], raw[16:].decode()
    mm: mmap.mmap | None = None
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        if mm[:16] != token:
            raise OSError("another file")
        mm[_HEADER + 8 * rank : _HEADER + 8 * (rank + 1)] = os.getpid().to_bytes(8, "little")
    except (OSError, ValueError):
        if mm is not None:
            mm.close()
        mm = None
    mapped = agree(mm is not None, group)
    if rank == 0 and path:
        os.unlink(path)  # every rank that could map it has: nothing is left behind if a rank dies
    if not mapped:
        if mm is not None:
            mm.close()
            return "this rank mapped the group's file, another could not (not on one host?)"
        return f"could not map the group's file {path or '(rank 0 could not create one)'} from {SHM_DIR}"
    assert mm is not None
    pids = [int.from_bytes(mm[_HEADER + 8 * r : _HEADER + 8 * (r + 1)], "little") for r in range(world)]
    visible = all(_alive(p) for p in pids)
    if not agree(visible, group):  # another pid namespace: peers cannot be watched
        mm.close()
        return "this rank sees every peer's process" if visible else "a peer's process is not visible here"
    return ShmTransport(mm, world, rank, pids)
