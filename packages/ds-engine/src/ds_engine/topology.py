"""The one topology of a job: every axis of parallelism on one ``DeviceMesh``, built once, by ds-engine.

The axes are DeepSpeed's, in DeepSpeed's order with the last varying fastest: ``pipe``, ``data``,
``sequence``, ``tensor``. So tensor- and sequence-parallel groups are consecutive ranks and a script that
shards its data by ``rank // tp`` sees the same ranks under ds as under DeepSpeed. Expert parallelism
splits the data axis: ``ep`` consecutive ranks of a data-parallel group hold different experts (the
``expert`` axis) and the ranks that hold the same experts, ``ep`` apart, form the ``expert_data`` axis, as
DeepSpeed's ``groups`` lays them out.

Each parallelism package (ds-pipe, ds-tpsp, ds-moe, ds-zero) takes the groups it needs as arguments;
``assemble()`` asks this topology for them. No package builds a group of its own.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["AXES", "ParallelTopology", "TopologyError", "build_topology", "get_topology", "reset_topology"]

AXES = ("pipe", "data", "sequence", "tensor")
_DATA_SEQUENCE = "data_sequence"  # data x sequence, flattened: ZeRO's reduction group under Ulysses


class TopologyError(ValueError):
    """The parallel degrees do not fit the world, or a second, different topology was asked for."""


@dataclass
class ParallelTopology:
    """Sizes of every axis and the meshes holding their groups (made collectively, on every rank)."""

    mesh: DeviceMesh
    _data_sequence: DeviceMesh | None = None
    _expert_meshes: dict[int, DeviceMesh] = field(default_factory=dict)

    def size(self, axis: str) -> int:
        if axis == _DATA_SEQUENCE:
            return self.size("data") * self.size("sequence")
        return self.mesh.size(self._dim(axis))

    def coord(self, axis: str) -> int:
        """This rank's index along ``axis`` (its rank inside that axis's group)."""
        if axis == _DATA_SEQUENCE:
            return self.coord("data") * self.size("sequence") + self.coord("sequence")
        return self.mesh.get_local_rank(self._dim(axis))

    def group(self, axis: str) -> ProcessGroup:
        """The process group of this rank along ``axis`` (``data_sequence``: data x sequence)."""
        if axis == _DATA_SEQUENCE:
            return (
                self._data_sequence.get_group(_DATA_SEQUENCE) if self._data_sequence else self.group("data")
            )
        return self.mesh.get_group(self._dim(axis))

    def ranks(self, axis: str) -> list[int]:
        """The global ranks of this rank's group along ``axis``, in group-rank order."""
        return dist.get_process_group_ranks(self.group(axis))

    @property
    def sizes(self) -> dict[str, int]:
        return {axis: self.size(axis) for axis in AXES}

    def expert_groups(self, ep_size: int) -> tuple[ProcessGroup, ProcessGroup]:
        """``(expert_parallel_group, expert_data_parallel_group)`` of this rank for ``ep_size``.

        Collective the first time a size is asked for: every rank must ask, in the same order (DeepSpeed's
        MoE layers do, from their constructors).
        """
        data = self.size("data")
        if ep_size < 1 or data % ep_size:
            raise TopologyError(
                f"expert-parallel size {ep_size} must divide the data-parallel size {data} "
                f"(world {dist.get_world_size()} = {self._describe()}); pick ep_size among "
                f"{[d for d in range(1, data + 1) if data % d == 0]}"
            )
        if ep_size not in self._expert_meshes:
            sizes = self.sizes
            layout = self.mesh.mesh.reshape(
                sizes["pipe"], data // ep_size, ep_size, sizes["sequence"], sizes["tensor"]
            )
            names = ("pipe", "expert_data", "expert", "sequence", "tensor")
            self._expert_meshes[ep_size] = DeviceMesh(self.mesh.device_type, layout, mesh_dim_names=names)
        mesh = self._expert_meshes[ep_size]
        return mesh.get_group("expert"), mesh.get_group("expert_data")

    def _dim(self, axis: str) -> int:
        if axis not in AXES:
            raise KeyError(f"no axis {axis!r}; the axes are {AXES + (_DATA_SEQUENCE,)}")
        return AXES.index(axis)

    def _describe(self) -> str:
        return " x ".join(f"{axis} {n}" for axis, n in self.sizes.items())


_CURRENT: ParallelTopology | None = None


def build_topology(
    *, pipe: int = 1, tensor: int = 1, sequence: int = 1, device_type: str | None = None
) -> ParallelTopology:
    """Build the job's topology (collective: every rank calls it, with the same sizes).

    The data axis takes what is left: ``world // (pipe * tensor * sequence)``. Asking again with the same
    sizes returns the one built; different sizes raise, since groups already handed out would be wrong.
    """
    global _CURRENT
    if not dist.is_initialized():
        raise TopologyError("the topology needs torch.distributed: call deepspeed.init_distributed() first")
    world = dist.get_world_size()
    model = pipe * tensor * sequence
    for name, n in (("pipe", pipe), ("tensor", tensor), ("sequence", sequence)):
        if n < 1:
            raise TopologyError(f"{name}-parallel size must be at least 1, got {n}")
    if world % model:
        raise TopologyError(
            f"pipe {pipe} x tensor {tensor} x sequence {sequence} = {model} does not divide the world size "
            f"{world}; launch a multiple of {model} ranks or change the degrees"
        )
    wanted = {"pipe": pipe, "data": world // model, "sequence": sequence, "tensor": tensor}
    if _CURRENT is not None:
        if _CURRENT.sizes != wanted:
            raise TopologyError(
                f"a topology ({_CURRENT._describe()}) was already built for this job; one job has one "
                f"topology, and {' x '.join(f'{a} {n}' for a, n in wanted.items())} differs from it"
            )
        return _CURRENT
    if device_type is None:
        device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    shape = tuple(wanted[axis] for axis in AXES)
    ranks = list(range(world))
    layout = torch.tensor(ranks, dtype=torch.int).reshape(shape)
    mesh = DeviceMesh(device_type, layout, mesh_dim_names=AXES)
    flat = None
    if sequence > 1:  # data x sequence as one axis: its own mesh, so that its group is made once, here
        flat_layout = layout.reshape(pipe, wanted["data"] * sequence, tensor)
        flat = DeviceMesh(device_type, flat_layout, mesh_dim_names=("pipe", _DATA_SEQUENCE, "tensor"))
    _CURRENT = ParallelTopology(mesh, flat)
    # forgotten at exit, before ds-launch's teardown destroys the groups (atexit runs last in, first out): a
    # mesh still held then keeps its groups' worker threads alive into finalization (see ds_launch)
    atexit.register(reset_topology)
    return _CURRENT


def get_topology() -> ParallelTopology:
    """The job's topology; a pure data-parallel one is built on first use when nothing asked for another."""
    return _CURRENT if _CURRENT is not None else build_topology()


def reset_topology() -> None:
    """Forget the topology (its groups stay alive until the process group is destroyed): tests and restarts."""
    global _CURRENT
    _CURRENT = None
