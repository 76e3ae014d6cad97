"""Where stage 3 keeps each piece of its state, decided once: the offload builder.

The options name up to two offloads (``offload_param``, ``offload_optimizer``), each to ``cpu`` or ``nvme``.
:class:`Offload` turns them into the objects stage 3 is built from: the one I/O pool both NVMe swaps share,
the parameter swap, the device of the weight partitions, the fp32 masters, the gradient partitions (in
memory, or files next to the optimizer state) and the optimizer-state swap. ``ZeroStage3Optimizer`` asks it
for each in turn instead of branching on the devices itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._aio import AsyncFileIO
from ._grad_parts import GradPartitions
from ._grad_swap import GradSwap
from ._heap import fix_mmap_threshold
from ._options import Stage3Options
from ._param_swap import ParamSwap
from ._partition import PartitionedParams
from ._swap import OptimizerSwap, SwapFolder, swap_unit

__all__ = ["Offload"]

_CPU = torch.device("cpu")


@dataclass
class Offload:
    """The placement of stage 3's state for one rank (``Offload.build``), and the builders of what lives there."""

    options: Stage3Options
    aio: AsyncFileIO | None  # one I/O pool for both NVMe swaps
    param_swap: ParamSwap | None  # the weight partitions in files (offload_param: nvme)
    optimizer_folder: SwapFolder | None  # masters, optimizer state and gradients in files (offload_optimizer: nvme)

    @classmethod
    def build(cls, options: Stage3Options, rank: int, world: int) -> Offload:
        nvme, param_nvme = options.optimizer_nvme, options.param_nvme
        if nvme is not None:  # a streamed step: its temporaries are not kept as heap (see ``_heap``)
            fix_mmap_threshold()
        aio = AsyncFileIO(options.aio) if nvme is not None or param_nvme is not None else None
        param_swap = None
        if param_nvme is not None:
            assert aio is not None
            folder = SwapFolder(param_nvme.nvme_path, rank, "offload_param", name="ds_swap_params", world=world)
            param_swap = ParamSwap(
                folder,
                aio,
                buffer_count=param_nvme.buffer_count,
                buffer_size=param_nvme.buffer_size,
                max_in_cpu=param_nvme.max_in_cpu,
                pin_memory=param_nvme.pin_memory,
            )
        optimizer_folder = (
            SwapFolder(nvme.nvme_path, rank, "offload_optimizer", world=world) if nvme is not None else None
        )
        return cls(options, aio, param_swap, optimizer_folder)

    @property
    def partition_device(self) -> torch.device | None:
        """Where the weight partitions live: the CPU when parameters are offloaded (to cpu or through it to
        files), else the parameters' own device (None)."""
        return _CPU if self.options.offload_param or self.param_swap is not None else None

    @property
    def master_device(self) -> torch.device | None:
        return _CPU if self.options.offload_optimizer or self.optimizer_folder is not None else None

    def masters(self, params: PartitionedParams) -> list[torch.Tensor]:
        """Each group's fp32 master partition. In files: an unwritten tensor (its pages never resident) whose
        storage ``optimizer_swap`` frees once the views are in the files. An fp32 weight partition on the
        master's device is the master itself (no second copy); otherwise a copy in fp32."""
        masters = []
        for g, (n, dtype) in enumerate(zip(params.part_numels, params.part_dtypes)):
            if self.optimizer_folder is not None:
                masters.append(torch.empty(n, dtype=torch.float32))
            elif (
                params.parts is not None
                and dtype == torch.float32
                and self.master_device in (None, params.parts[g].device)
            ):
                masters.append(params.parts[g])
            else:
                part = params.read_part(g, 0, n)
                masters.append(part.detach().to(self.master_device or part.device, torch.float32, copy=True))
        return masters

    def grad_parts(self, params: PartitionedParams, dtypes: Sequence[torch.dtype]) -> GradPartitions | GradSwap:
        """The averaged gradient partitions: in files next to the masters and state (``_grad_swap``) when
        the optimizer is on NVMe, else allocated by a backward and freed by the step."""
        if self.optimizer_folder is not None:
            assert self.aio is not None
            return GradSwap(self.optimizer_folder, self.aio, params.part_numels, list(dtypes))
        return GradPartitions(params.part_numels, list(dtypes), params.compute_devices)

    def optimizer_swap(
        self,
        views: list[list[torch.Tensor]],
        masters: list[torch.Tensor],
        params: PartitionedParams,
        grads: GradPartitions | GradSwap,
    ) -> OptimizerSwap | None:
        """With the optimizer on NVMe: the swap of the masters and the optimizer state, its masters written
        from the weight partitions, and the masters' memory released. None otherwise."""
        nvme = self.options.optimizer_nvme
        if nvme is None:
            return None
        assert self.aio is not None and self.optimizer_folder is not None and isinstance(grads, GradSwap)
        swap = OptimizerSwap(
            self.optimizer_folder,
            self.aio,
            views,
            buffer_count=nvme.buffer_count,
            pipeline_read=nvme.pipeline_read,
            pipeline_write=nvme.pipeline_write,
            pin_memory=nvme.pin_memory,
            grads=grads,
            unit_numel=swap_unit(self.options.sub_group_size),
        )
        swap.init_masters(lambda g, lo, hi: params.read_part(g, lo, hi).to("cpu", torch.float32))
        for master in masters:
            master.untyped_storage().resize_(0)
        return swap
