"""The one object that owns this process's place in the job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch costs seconds to import; the CLI and hostfile tools must not pay for it
    import torch

__all__ = ["Topology"]


@dataclass(frozen=True)
class Topology:
    """Rank, world and device of this process, as ``init_distributed`` established them.

    ``source`` says where the ranks came from: ``"mpi4py"``, ``"env:RANK"`` (torchrun, ds-launch),
    ``"env:OMPI"``, ``"env:PMI"``, ``"slurm"``, ``"torch.distributed"`` (a process group someone
    else initialised) or ``"default"`` (plain ``python``: a world of one).
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    backend: str  # "gloo" | "nccl"
    device: torch.device  # cuda:local_rank or cpu
    source: str
    # the network interface the backend's sockets use, and why: "eth0 (routes to the master address)",
    # "eth0 (GLOO_SOCKET_IFNAME)" where the user set it; "" where the backend chose (a world of one)
    interface: str = ""

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that logs and writes shared files."""
        return self.rank == 0

    @property
    def node_count(self) -> int:
        """Hosts in the job, assuming every host runs ``local_world_size`` ranks."""
        return max(1, self.world_size // max(1, self.local_world_size))

    def describe(self) -> str:
        """One line for logs: who this rank is and where each fact came from."""
        return (
            f"rank {self.rank}/{self.world_size} local {self.local_rank}/{self.local_world_size} "
            f"(from {self.source}), master {self.master_addr}:{self.master_port}, backend {self.backend}, "
            f"device {self.device}" + (f", network {self.interface}" if self.interface else "")
        )
