"""ZeRO++ across hosts: hpZ (a secondary partition inside each host) and qgZ (4-bit hierarchical reduction).

The groups come from the caller (ds-engine makes them from the launcher's ranks per host), in the
data-parallel group's rank order, hosts holding consecutive ranks:

* ``hpz``: ``zero_hpz_partition_size`` consecutive ranks. When a parameter is gathered from the primary
  partitions (across every host), each rank of its hpz group keeps its ``1/hpz`` equal chunk of the whole
  value (the *secondary* partition); until the partitions change (the step, a load, a modification),
  later gathers of that parameter (backward's, the next micro-step's) are one all-gather of those chunks
  inside the group, with no traffic to other hosts. The values are the ones the first gather gave, so
  training is exactly plain ZeRO-3's.
* ``local`` (this rank's host) and ``cross`` (the ranks of this rank's local index on every host): qgZ
  reduces a gradient bucket with two all-to-alls, as DeepSpeed's ``all_to_all_quant_reduce`` does. Inside
  the host, each rank sends local rank ``d`` the slices owned by the ranks of local index ``d`` (4-bit,
  ``_quant``); ``d`` sums what it received in fp32, so it holds its host's sum of those slices. Across
  hosts, it sends each host's rank of its own local index that rank's slice of the host sum (4-bit
  again), and each owner sums the hosts' partial sums. A host sends ``1/local`` of a bucket at 4 bits
  across the network instead of the whole bucket at the gradient's width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .._comm import ProcessGroup, group_rank, group_size
from .._errors import ZeroConfigError
from .._layout import GroupLayout
from ._quant import GRAD_BITS, GRAD_BLOCK, dequantize, payload_bytes, quantize

__all__ = ["HostGroups", "QuantizedReduction", "SecondaryGather", "check_host_groups"]


@dataclass(frozen=True)
class HostGroups:
    """The process groups of ZeRO++, made by the caller on every rank in the same order (see the module doc)."""

    hpz: ProcessGroup | None = None  # zero_hpz_partition_size consecutive ranks
    local: ProcessGroup | None = None  # this rank's host
    cross: ProcessGroup | None = None  # the ranks of this rank's local index, one per host, in host order


def check_host_groups(
    groups: HostGroups | None, *, hpz_size: int, quantized_gradients: bool, dp: int
) -> HostGroups:
    """The groups, checked against the options (an error says which group is missing or wrong)."""
    groups = groups or HostGroups()
    if hpz_size > 1:
        if dp % hpz_size:
            raise ZeroConfigError(
                f"zero_hpz_partition_size {hpz_size} must divide the data-parallel size {dp}"
            )
        if groups.hpz is None or group_size(groups.hpz) != hpz_size:
            raise ZeroConfigError(
                f"zero_hpz_partition_size {hpz_size} needs its group of {hpz_size} consecutive ranks "
                "(host_groups.hpz); ds_engine makes it from the launcher's ranks per host"
            )
    if quantized_gradients and dp > 1:
        if groups.local is None or groups.cross is None:
            raise ZeroConfigError(
                "zero_quantized_gradients needs the host groups (host_groups.local and .cross); ds_engine "
                "makes them from the launcher's ranks per host (LOCAL_WORLD_SIZE)"
            )
        if group_size(groups.local) * group_size(groups.cross) != dp:
            raise ZeroConfigError(
                f"zero_quantized_gradients: ranks per host ({group_size(groups.local)}) x hosts "
                f"({group_size(groups.cross)}) must be the data-parallel size {dp}"
            )
    return groups


class SecondaryGather:
    """The hpZ secondary partitions: cut after a primary gather, all-gathered inside the hpz group."""

    def __init__(self, group: ProcessGroup) -> None:
        self.group = group
        self.size, self.rank = group_size(group), group_rank(group)
        self.calls = 0  # all-gathers issued (observed by the tests)

    def chunk(self, numel: int) -> int:
        return -(-numel // self.size)

    def keep(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of the whole flat value ``full`` (a copy, zero-padded)."""
        c = self.chunk(full.numel())
        out = torch.zeros(c, dtype=full.dtype, device=full.device)
        mine = full[self.rank * c : (self.rank + 1) * c]
        out[: mine.numel()].copy_(mine)
        return out

    def launch(self, secondaries: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]):
        """All-gather the chunks of several parameters into their flat ``outs`` in one collective; returns
        a work whose ``wait()`` also copies the values out."""
        send = torch.cat(list(secondaries))
        recv = [torch.empty_like(send) for _ in range(self.size)]
        self.calls += 1
        work = dist.all_gather(recv, send, group=self.group, async_op=True)

        def unpack() -> None:
            pos = 0
            for sec, out in zip(secondaries, outs):
                c = sec.numel()
                for r, got in enumerate(recv):
                    piece = out[r * c : (r + 1) * c]
                    piece.copy_(got[pos : pos + piece.numel()])
                pos += c

        return _Then([work], unpack)


class _Then:
    """Works, and what to do once they are done (once)."""

    def __init__(self, works: list, then: Callable[[], None] | None) -> None:
        self._works, self._then = works, then

    def wait(self) -> None:
        for w in self._works:
            w.wait()
        self._works = []
        if self._then is not None:
            then, self._then = self._then, None
            then()


class QuantizedReduction:
    """One bucket's qgZ reduction (see the module doc). After ``wait()`` this rank's owned slice of
    ``buf`` holds the sum over every rank (within the quantization error); the rest of ``buf`` is stale."""

    def __init__(
        self, buf: torch.Tensor, layout: GroupLayout, start: int, end: int, groups: HostGroups, dp_rank: int
    ) -> None:
        self.buf = buf
        local, cross = groups.local, groups.cross
        L, N = group_size(local), group_size(cross)
        j = dp_rank % L
        size = {r: (lo, hi) for r, lo, hi in layout.owners(start, end)}
        span = [size.get(r, (start, start)) for r in range(L * N)]
        n_of = [hi - lo for lo, hi in span]

        def nbytes(r: int) -> int:
            return payload_bytes(n_of[r], GRAD_BITS, GRAD_BLOCK)

        # 1. inside the host: to local rank d, the slices of the owners of local index d on every host
        send, splits = [], []
        for d in range(L):
            part = [quantize(buf[lo - start : hi - start], GRAD_BITS, GRAD_BLOCK) for lo, hi in
                    (span[n * L + d] for n in range(N))]  # fmt: skip
            send.extend(part)
            splits.append(sum(nbytes(n * L + d) for n in range(N)))
        mine = [n * L + j for n in range(N)]
        each = sum(nbytes(r) for r in mine)
        recv = torch.empty(each * L, dtype=torch.uint8, device=buf.device)
        dist.all_to_all_single(recv, torch.cat(send), [each] * L, splits, group=local)
        partial = [torch.zeros(n_of[r], dtype=torch.float32, device=buf.device) for r in mine]
        for s in range(L):
            pos = s * each
            for k, r in enumerate(mine):
                partial[k] += dequantize(recv[pos : pos + nbytes(r)], n_of[r], GRAD_BITS, GRAD_BLOCK)
                pos += nbytes(r)
        # 2. across hosts: to host n, its owner's slice of this host's sum
        me = dp_rank
        self._n, self._lo = n_of[me], span[me][0] - start
        self._nb, self._hosts = nbytes(me), N
        out = torch.cat([quantize(p, GRAD_BITS, GRAD_BLOCK) for p in partial])
        self._recv = torch.empty(self._nb * N, dtype=torch.uint8, device=buf.device)
        self._work = dist.all_to_all_single(
            self._recv, out, [self._nb] * N, [nbytes(r) for r in mine], group=cross, async_op=True
        )
        self.owned = [(span[me][0], buf[self._lo : self._lo + self._n])]

    def wait(self) -> None:
        if self._work is None:
            return
        self._work.wait()
        self._work = None
        total = torch.zeros(self._n, dtype=torch.float32, device=self.buf.device)
        for m in range(self._hosts if self._n else 0):
            total += dequantize(self._recv[m * self._nb : (m + 1) * self._nb], self._n, GRAD_BITS, GRAD_BLOCK)
        self.buf[self._lo : self._lo + self._n].copy_(total)
