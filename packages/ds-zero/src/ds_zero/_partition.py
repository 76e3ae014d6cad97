"""ZeRO's flat, partitioned parameter groups: the model's weights become views of one buffer per group."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ._comm import ProcessGroup
from ._errors import ZeroConfigError
from ._layout import GroupLayout
from ._options import ZeroOptions

__all__ = ["FlatGroup", "build_group"]


@dataclass
class FlatGroup:
    """One optimizer param group, flattened and partitioned (rank ``rank`` of ``layout.dp``)."""

    index: int
    params: list[nn.Parameter]
    names: list[str]
    layout: GroupLayout
    rank: int
    flat: torch.Tensor  # full padded low-precision buffer; params are views into it
    # fp32 weights of this rank's partition, the inner optimizer's only param: a view of ``flat`` when the
    # model is fp32 and on the device the master belongs on (a second copy would only duplicate it:
    # offload of fp32 weights that already live in CPU memory), else its own tensor
    master: torch.Tensor
    grad_dtype: torch.dtype  # dtype of the partition gradient (fp32 with fp32 gradient accumulation)
    opt_group: dict
    # this rank's averaged (still loss-scaled) partition gradient; None between steps (nothing reads it)
    grad_part: torch.Tensor | None = None
    # stage 1 with contiguous_gradients, offload or fp32 accumulation: the dtype of the flat buffer the full
    # local gradient accumulates in (None: no such buffer)
    flat_grad_dtype: torch.dtype | None = None
    # that buffer: allocated by an accumulation window's first backward, freed once the step has reduced it
    flat_grad: torch.Tensor | None = None
    norm_ranges: list[tuple[int, int]] | None = None  # see norm_ranges()
    # the ranks ``layout.dp`` counts, over which this group is partitioned, its gradients reduced and its
    # weights gathered: the optimizer's data-parallel group, or an expert group's expert-data-parallel one
    process_group: ProcessGroup | None = None

    @property
    def partition(self) -> tuple[int, int]:
        """``[start, end)`` of this rank's partition in the padded flat space."""
        return self.layout.partition_range(self.rank)

    @property
    def master_is_view(self) -> bool:
        """True when the master partition shares the weights' storage (fp32 model, not moved by offload)."""
        return self.master.untyped_storage().data_ptr() == self.flat.untyped_storage().data_ptr()

    def grad_part_for_update(self) -> torch.Tensor:
        """The partition gradient, allocated (zeros) at the first reduction of a window."""
        if self.grad_part is None:
            self.grad_part = torch.zeros(
                self.layout.partition_numel, dtype=self.grad_dtype, device=self.flat.device
            )
        return self.grad_part

    def flat_grad_for_window(self) -> torch.Tensor:
        """The flat gradient buffer of this accumulation window, allocated (zeros) on first use."""
        assert self.flat_grad_dtype is not None
        if self.flat_grad is None:
            self.flat_grad = torch.zeros(
                self.layout.padded_numel, dtype=self.flat_grad_dtype, device=self.flat.device
            )
        return self.flat_grad

    def write_master_back(self) -> None:
        """Copy the updated master partition into the weights (nothing to do when it is a view of them)."""
        if not self.master_is_view:
            ps, pe = self.partition
            self.flat[ps:pe].copy_(self.master.detach())


def build_group(
    index: int,
    opt_group: dict,
    names: dict[int, str],
    opts: ZeroOptions,
    dp: int,
    rank: int,
    mp_rank: int | None,
    process_group: ProcessGroup | None = None,
) -> FlatGroup:
    """Flatten ``opt_group``'s trainable params, make them views of the buffer, re-point the group at the master.

    The group is partitioned over ``process_group``, of ``dp`` ranks (this one is ``rank``).
    ``mp_rank`` is this rank's model-parallel rank, or None without model parallelism.
    """
    params = [p for p in opt_group["params"] if p.requires_grad]
    dtypes = {p.dtype for p in params}
    devices = {p.device for p in params}
    if len(dtypes) > 1 or len(devices) > 1:
        raise ZeroConfigError(
            f"param group {index} mixes dtypes {sorted(map(str, dtypes))} or devices "
            f"{sorted(map(str, devices))}; ZeRO flattens a group into one buffer, so "
            "cast the model to one dtype/device (or split the groups) first"
        )
    dtype = params[0].dtype if params else torch.float32
    device = params[0].device if params else torch.device("cpu")
    layout = GroupLayout.build([p.shape for p in params], dp)
    flat = torch.zeros(layout.padded_numel, dtype=dtype, device=device)
    for i, p in enumerate(params):
        start, end = layout.param_range(i)
        flat[start:end].copy_(p.detach().reshape(-1))
        p.data = flat[start:end].view_as(p)
    ps, pe = layout.partition_range(rank)
    master = _master(flat[ps:pe], opts)
    opt_group["params"] = [master]
    accum_dtype = opts.grad_accum_dtype or dtype
    param_names = [names.get(id(p), f"group{index}.param{i}") for i, p in enumerate(params)]
    group = FlatGroup(index, params, param_names, layout, rank, flat, master, accum_dtype, opt_group)
    group.process_group = process_group
    if opts.stage == 1 and (opts.contiguous_gradients or opts.cpu_offload or accum_dtype != dtype):
        group.flat_grad_dtype = accum_dtype
    spans = ((p, *group.layout.param_range(i)) for i, p in enumerate(group.params))
    group.norm_ranges = norm_ranges(spans, group.partition, mp_rank)
    return group


def _master(weights: torch.Tensor, opts: ZeroOptions) -> torch.Tensor:
    """The fp32 master partition: the weights themselves when they are fp32 and already live where the
    master must (on the CPU with offload): a second copy would only duplicate them."""
    in_place = not opts.cpu_offload or weights.device.type == "cpu"
    if weights.dtype == torch.float32 and in_place:
        return weights.detach()  # shares storage: the optimizer updates the model's weights directly
    master = weights.detach().to("cpu" if opts.cpu_offload else weights.device, torch.float32, copy=True)
    if opts.cpu_offload and opts.pin_memory and torch.cuda.is_available():
        # page-locked memory speeds host<->device copies; only a CUDA runtime can provide it
        master = master.pin_memory()
    return master


def norm_ranges(
    spans: Iterable[tuple[nn.Parameter, int, int]], partition: tuple[int, int], mp_rank: int | None
) -> list[tuple[int, int]] | None:
    """Ranges of this rank's partition ``[ps, pe)`` of a flat group that count towards the global norm
    (None: all of it), from the group's ``(param, start, end)`` flat spans. Stages 1-3 use this rule.

    With a model-parallel group, a parameter replicated across model-parallel ranks counts on
    model-parallel rank 0 only; one marked ``model_parallel`` or ``tensor_model_parallel`` (a shard)
    counts on every rank (docs/design.md §5).
    """
    if mp_rank is None or mp_rank == 0:
        return None
    ps, pe = partition
    return [
        (max(start, ps) - ps, min(end, pe) - ps)
        for p, start, end in spans
        if _is_model_parallel(p) and start < pe and end > ps
    ]


def _is_model_parallel(p: nn.Parameter) -> bool:
    """Megatron marks its sharded parameters with one of these attributes."""
    return bool(getattr(p, "model_parallel", False) or getattr(p, "tensor_model_parallel", False))
