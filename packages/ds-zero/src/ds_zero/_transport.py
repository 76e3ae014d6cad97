"""Host transports: faster carriers than gloo for ZeRO's CPU collectives, chosen once per process group.

Two exist, tried in this order when a reducer or optimizer is built (``enable``, a collective over the
group):

- **MPI** (``_mpi.py``): under ``mpirun``, when ds_launch found the ranks through mpi4py;
- **shared memory** (``_shm.py``): when every rank of a gloo group reports the same host (hostname and
  boot id: ``_shm.host_identity``) and can map one file in ``/dev/shm`` (ds-launch's and torchrun's
  single-node jobs). A group spanning hosts keeps torch.distributed (or MPI), even where the hosts share a
  /dev/shm or a filesystem.

Anything a transport does not take (CUDA tensors, dtypes it has no sum for, a non-contiguous tensor)
stays on torch.distributed. ``DS_ZERO_COLLECTIVES`` picks: ``auto`` (default: MPI, else shared memory),
``mpi`` or ``shm`` (that one only), ``torch`` (torch.distributed only).

A transport runs its collectives in launch order on one worker thread per process, so a launch returns at
once, as ``async_op=True`` does; the callers launch in the same order on every rank, as gloo needs too.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from ds_config import env_choice

from . import _mpi, _shm
from ._host_transport import HostTransport, Work

__all__ = ["ENV", "HostTransport", "Work", "calls", "enable", "transport"]

ENV = "DS_ZERO_COLLECTIVES"
CHOICES = ("auto", "mpi", "shm", "torch")
logger = logging.getLogger("ds_zero")


_transports: dict[int, tuple[Any, HostTransport]] = {}  # id(group object) -> (the group, its transport)
_calls: dict[str, list[HostTransport]] = {"mpi": [], "shm": []}


def _group_object(group: dist.ProcessGroup | None) -> Any:
    return dist.group.WORLD if group is None else group


def _agree(ok: bool, group: dist.ProcessGroup | None) -> bool:
    """True when ``ok`` holds on every rank of ``group`` (a collective)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def choice() -> str:
    return env_choice(ENV, CHOICES, "auto")


def enable(group: dist.ProcessGroup | None) -> HostTransport | None:
    """Decide, together with the group's other ranks, which host transport carries ``group``'s
    collectives. A collective over ``group``: every rank calls it at the same point (when a reducer or
    optimizer is built). Returns the transport, or None (torch.distributed carries everything)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return None
    key = id(_group_object(group))
    if key in _transports and _transports[key][0] is _group_object(group):
        return _transports[key][1]
    wanted = choice()
    made: HostTransport | str = "not tried"
    if wanted in ("auto", "mpi"):
        made = _mpi.enable(group, _agree)
    if isinstance(made, str) and wanted in ("auto", "shm"):
        made = _shm.enable(group, _agree)
    if isinstance(made, str):
        if wanted in ("mpi", "shm"):  # asked for by name: say why it was not taken, rank by rank
            _warn_not_taken(wanted, made, group)
        return None
    _transports[key] = (_group_object(group), made)
    if made not in _calls[made.kind]:
        _calls[made.kind].append(made)
        if dist.get_rank() == 0:
            logger.info(
                "ds-zero: CPU collectives of a %d-rank group go over %s; set %s=torch for torch.distributed",
                dist.get_world_size(group),
                "MPI (mpi4py)" if made.kind == "mpi" else "shared memory",
                ENV,
            )
    return made


def _warn_not_taken(wanted: str, mine: str, group: dist.ProcessGroup | None) -> None:
    """The group's rank 0 logs every rank's reason (a collective: each rank that failed to agree calls it)."""
    world = dist.get_world_size(group)
    reasons: list[Any] = [None] * world
    dist.all_gather_object(reasons, mine, group=group)
    if dist.get_rank(group) == 0:
        logger.warning(
            "ds-zero: %s=%s was not taken for a %d-rank group; torch.distributed carries its collectives. %s",
            ENV, wanted, world, "; ".join(f"rank {r}: {why}" for r, why in enumerate(reasons)),
        )  # fmt: skip


def transport(group: dist.ProcessGroup | None, *tensors: torch.Tensor) -> HostTransport | None:
    """The host transport that carries ``tensors`` over ``group``, or None (torch.distributed carries them)."""
    if not _transports or not tensors:
        return None
    entry = _transports.get(id(_group_object(group)))
    if entry is None or entry[0] is not _group_object(group):
        return None
    t = entry[1]
    return t if all(t.carries(x) for x in tensors) else None


def calls(kind: str = "mpi") -> int:
    """How many collectives the ``kind`` transport (``mpi`` or ``shm``) carried in this process."""
    return sum(t.calls for t in _calls[kind])
