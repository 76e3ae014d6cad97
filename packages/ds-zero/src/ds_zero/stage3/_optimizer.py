"""ZeRO stage 3: weights, gradients, fp32 masters and optimizer state all partitioned across the group."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from ds_config import DSConfig
from torch import nn

from .. import _transport
from .._comm import AveragingRule, ProcessGroup, group_rank, group_size
from .._errors import StateDictMismatchError, ZeroConfigError
from .._fragments import Fragment, ParamFragments, ParamSpan, attach_owner
from .._options import check_step_options
from .._partition import norm_ranges
from .._protocol import LossScalerProtocol
from .._step import LossScaledStep, partition_norm_sq
from ._fetch import FetchSchedule
from ._grad_swap import GradSwap
from ._grads import Stage3Reducer
from ._heap import release_freed_heap, step_threshold
from ._hooks import GatherHooks
from ._offload import Offload
from ._options import Stage3Options
from ._partition import PartitionedParams
from ._state import load_sharded, sharded_state
from ._subgroups import SubGroups, view_size
from ._zeropp import HostGroups, SecondaryGather, check_host_groups

__all__ = ["ZeroStage3Optimizer"]


class ZeroStage3Optimizer(LossScaledStep, ParamFragments):
    """Wrap a torch optimizer and its model with ZeRO stage 3.

    Each param group's trainable parameters share one flat space laid out as in stages 1 and 2; a rank
    keeps only its partition of it: the weights in the model dtype, the averaged gradient, the fp32
    master and the inner optimizer's state (the inner optimizer is re-pointed at the fp32 partition, cut
    into ``sub_group_size`` views stepped one at a time, see ``_subgroups``; in fp32 training the master
    *is* the weight partition). Parameters are whole while a module's forward or backward runs, and when
    the fetch schedule prefetches or keeps them (see ``_hooks``, ``_fetch``); gradients are reduced
    to their owners as backward produces them (see ``_grads``), launched by the ``BucketSchedule`` of
    stages 0-2. The contract per step is the one of ``ZeroOptimizer``: ``backward(loss)`` every
    micro-step (or ``loss.backward()`` then ``micro_step_done()``), ``step()`` at the boundary (False
    when skipped for overflow).
    """

    norm_after_scale_update = True  # the norm DeepSpeed 0.19.8's stage 3 reports (LossScaledStep)

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        options: Stage3Options | None = None,
        *,
        process_group: ProcessGroup | None = None,
        scaler: LossScalerProtocol | None = None,
        param_names: dict[int, str] | None = None,
        model_parallel_group: ProcessGroup | None = None,
        host_groups: HostGroups | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ZeRO stage 3 needs torch.distributed: call init_process_group first")
        self.options = options = options or Stage3Options()
        check_step_options(
            optimizer,
            allow_untested_optimizer=options.allow_untested_optimizer,
            clip_grad=options.clip_grad,
            gradient_predivide_factor=options.gradient_predivide_factor,
            grad_accum_dtype=options.grad_accum_dtype,
        )
        self.module = module
        self.optimizer = optimizer
        self.process_group = process_group
        self.scaler = scaler
        self.clip_grad = float(options.clip_grad)
        self.dp, self.rank = group_size(process_group), group_rank(process_group)
        self.host_transport = _transport.enable(process_group)  # MPI or shared memory (``_transport.py``)
        self.host_groups = host_groups = check_host_groups(  # ZeRO++ (``_zeropp``)
            host_groups,
            hpz_size=options.hpz_partition_size,
            quantized_gradients=options.quantized_gradients,
            dp=self.dp,
        )
        self.global_grad_norm: float | None = None
        self.skipped_steps = 0
        groups = [[p for p in g["params"] if p.requires_grad] for g in optimizer.param_groups]
        offload = Offload.build(options, self.rank, self.dp)  # where each piece of state lives (``_offload``)
        self.aio = offload.aio
        self.params = PartitionedParams(
            groups,
            param_names or {id(p): n for n, p in module.named_parameters()},
            process_group=process_group,
            persistence_threshold=options.param_persistence_threshold,
            model_persistence_threshold=options.model_persistence_threshold,
            partition_device=offload.partition_device,
            swap=offload.param_swap,
            hpz=SecondaryGather(host_groups.hpz) if options.hpz_partition_size > 1 and self.dp > 1 else None,
            quantize_weights=options.quantized_weights,
            frozen=[p for p in module.parameters() if not p.requires_grad],
            quantize_frozen=options.quantized_nontrainable_weights,
        )
        params = self.params
        self.masters = offload.masters(params)
        self.grad_parts = offload.grad_parts(
            params, [options.grad_accum_dtype or d for d in params.part_dtypes]
        )
        self.sub_groups = SubGroups(self.masters, view_size(optimizer, options.sub_group_size))
        for g, views in zip(optimizer.param_groups, self.sub_groups.views):
            g["params"] = views
        optimizer.state.clear()  # any state was keyed by the old, replaced parameters
        self.swap = offload.optimizer_swap(self.sub_groups.views, self.masters, params, self.grad_parts)
        self.params.on_write = self._copy_into_master
        self.grads = Stage3Reducer(
            self.params,
            self.grad_parts,
            bucket_elems=options.reduce_bucket_size,
            rule=AveragingRule(self.dp, options.prescale_gradients, options.gradient_predivide_factor),
            overlap_comm=options.overlap_comm,
            quantized=host_groups if options.quantized_gradients and self.dp > 1 else None,
        )
        self.schedule = FetchSchedule(
            self.params,
            prefetch_bucket_size=options.prefetch_bucket_size,
            max_live=options.max_live_parameters,
            max_reuse_distance=options.max_reuse_distance,
        )
        self.hooks = GatherHooks(module, self.params, self.grads.grad_ready, self.schedule)
        # with model parallelism the norm also sums over the model-parallel group (docs/design.md §5)
        self.mp_group = model_parallel_group if group_size(model_parallel_group) > 1 else None
        self._norm_ranges = self._model_parallel_norm_ranges()
        attach_owner((s.param for s in self.params.slots.values() if s.frozen is None), self)
        release_freed_heap()  # the construction chunks and the move's temporaries (see _heap)

    @classmethod
    def from_config(
        cls,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: DSConfig,
        *,
        process_group: ProcessGroup | None = None,
        scaler: LossScalerProtocol | None = None,
        param_names: dict[int, str] | None = None,
        model_parallel_group: ProcessGroup | None = None,
        host_groups: HostGroups | None = None,
    ) -> ZeroStage3Optimizer:
        """Build from a loaded config: the keys stage 3 reads are ``CONFIG_FIELDS_STAGE3``."""
        return cls(
            module,
            optimizer,
            Stage3Options.from_config(config),
            process_group=process_group,
            scaler=scaler,
            param_names=param_names,
            model_parallel_group=model_parallel_group,
            host_groups=host_groups,
        )

    # ------------------------------------------------------------------ micro-steps
    def set_boundary(self, is_boundary: bool) -> None:
        """Say whether the coming backward ends an accumulation window: with the gradients in files only that
        backward's writes take the norm's pieces (``GradSwap.track_norms``; the norm is exact either way)."""
        if isinstance(self.grad_parts, GradSwap):
            self.grad_parts.track_norms = is_boundary

    def backward(self, loss: torch.Tensor, *, retain_graph: bool = False) -> None:
        """Backward of ``loss * loss_scale`` for one micro-step (the loss is already divided by GAS)."""
        scaled = self._scaled_loss(loss)
        scaled.backward(retain_graph=retain_graph)
        self.micro_step_done()

    def micro_step_done(self) -> None:
        """Finish a micro-step's backward: reduce what is left, release what is still gathered."""
        self.grads.flush()
        self.hooks.end_backward()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the partition gradients for the next accumulation window (their memory is freed)."""
        self.grad_parts.clear()

    # ------------------------------------------------------------------ step
    def step(self) -> bool:
        """Optimizer step on this rank's partitions; returns False when skipped for overflow."""
        grads = list(self.grad_parts)  # zeros for a group no backward reduced into
        if self.swap is not None:  # the first sub-groups' reads run under the gradient norm
            self.swap.prefetch()
        divisor = self._begin_step(self._global_norm_sq(grads))
        if divisor is None:
            if self.swap is not None:
                self.swap.drop_prefetched()
            return False
        if self.swap is not None:  # masters and state streamed through the swap buffers
            self.swap.step(self.optimizer, grads, 1.0 / divisor, self._master_updated)
            del grads
            self.params.refresh_whole()
        else:
            self.sub_groups.step(self.optimizer, grads, 1.0 / divisor)
            del grads  # so that the zero_grad of _end_step frees them before the weights are gathered
            self._masters_to_parts()
        self._end_step()
        # the step's gathers, gradients, buckets and temporaries, when that is much (see _heap)
        release_freed_heap(step_threshold())
        return True

    def _masters_to_parts(self) -> None:
        """Write the fp32 masters into the weight partitions (unless they are the same storage)."""
        with self._resident_masters(write=False) as masters, torch.no_grad():
            for g, master in enumerate(masters):
                if not self.params.shares_storage(g, master):
                    self.params.write_part(g, 0, master.numel(), master, wait=False)
        self.params.refresh_whole()

    def _master_updated(self, g: int, lo: int, hi: int, master: torch.Tensor) -> None:
        """A swapped sub-group's new fp32 master reaches its weight partition (with the partitions in files,
        written while the next sub-groups step: ``refresh_whole`` waits for the writes)."""
        self.params.write_part(g, lo, hi, master, wait=False)

    @contextmanager
    def _resident_masters(self, *, write: bool) -> Iterator[list[torch.Tensor]]:
        """The fp32 masters (and the optimizer state on the views) whole in memory while inside: as they are,
        or read from the swap files with NVMe offload (written back on exit with ``write``)."""
        if self.swap is None:
            yield self.masters
        else:
            with self.swap.resident(self.optimizer, write=write) as masters:
                yield masters

    def _global_norm_sq(self, grads: list[torch.Tensor]) -> float:
        """Squared L2 norm of every partition's gradient (inf when any rank saw inf/nan)."""
        # reduced where the parameters compute: the gradient partitions may be in CPU memory (offload)
        devices = self.params.compute_devices
        device = devices[0] if devices else torch.device("cpu")
        return partition_norm_sq(
            list(zip(grads, self._norm_ranges)), device, self.process_group, self.mp_group
        )

    def _model_parallel_norm_ranges(self) -> list[list[tuple[int, int]] | None]:
        """Per group, the partition ranges counted in the norm (None: all of it), by the rule of stages
        1 and 2 (``_partition.norm_ranges``)."""
        mp_rank = group_rank(self.mp_group) if self.mp_group is not None else None
        spans: list[list[tuple[nn.Parameter, int, int]]] = [[] for _ in range(len(self.grad_parts))]
        for s in self.params.slots.values():
            if s.frozen is None:
                spans[s.group].append((s.param, s.start, s.end))
        return [
            norm_ranges(spans[g], self.params.layouts[g].partition_range(self.rank), mp_rank)
            for g in range(len(self.grad_parts))
        ]

    def _copy_into_master(self, g: int, lo: int, hi: int) -> None:
        if self.swap is not None:
            self.swap.write_range(g, "master", lo, hi, self.params.read_part(g, lo, hi))
            return
        if not self.params.shares_storage(g, self.masters[g]):
            with torch.no_grad():
                self.masters[g][lo:hi].copy_(self.params.read_part(g, lo, hi))

    # ------------------------------------------------------------------ one parameter (ParamFragments)
    def _span(self, param: nn.Parameter) -> ParamSpan:
        slot = self.params.slot(param)
        if slot is None or slot.frozen is not None:
            raise ZeroConfigError(
                "this ZeRO-3 optimizer does not train that parameter (frozen, or another model's)"
            )
        return ParamSpan(
            slot.group, self.params.layouts[slot.group], self.rank, slot.start, slot.end, slot.shape
        )

    def _device(self, span: ParamSpan) -> torch.device:
        return self.params.compute_devices[span.group]

    def _read_piece(self, span: ParamSpan, what: Fragment, key: str | None) -> torch.Tensor | None:
        lo, hi = span.local()
        if self.swap is not None and what != "grad":
            return self.swap.read_range(span.group, "master" if what == "fp32" else str(key), lo, hi)
        if what == "fp32":
            return self.masters[span.group].detach()[lo:hi]
        if what == "grad":  # zeros when no backward reduced into it since the step, as DeepSpeed's stage 3
            part = self.grad_parts.read(span.group, lo, hi)
            return self.masters[span.group].new_zeros(hi - lo) if part is None else part
        pieces = self.sub_groups.state_range(self.optimizer, span.group, str(key), lo, hi)
        return torch.cat([p for p, _, _ in pieces]) if pieces else self.masters[span.group].new_zeros(0)

    def _write_piece(self, span: ParamSpan, what: Fragment, key: str | None, values: torch.Tensor) -> None:
        lo, hi = span.local()
        if self.swap is not None and what != "grad":
            self.swap.write_range(span.group, "master" if what == "fp32" else str(key), lo, hi, values)
            return
        with torch.no_grad():
            if what == "fp32":
                self.masters[span.group][lo:hi].copy_(values)
            elif what == "grad":
                self.grad_parts.write(span.group, lo, hi, values)
            else:
                for piece, a, b in self.sub_groups.state_range(self.optimizer, span.group, str(key), lo, hi):
                    piece.copy_(values[a - lo : b - lo])

    def _after_full_write(self, param: nn.Parameter, span: ParamSpan, value: torch.Tensor) -> None:
        """fp32 weights are their own master: a whole copy of the parameter (persistent, gathered) takes the
        value now. A separate master reaches the weights at the next step, as in DeepSpeed."""
        slot = self.params.slots[id(param)]
        if self.params.shares_storage(span.group, self.masters[span.group]):
            with torch.no_grad():
                self.params.write_back(slot, value.to(slot.param.dtype).reshape(slot.shape))

    # ------------------------------------------------------------------ state
    def sharded_state_dict(self) -> tuple[dict[str, torch.Tensor], dict]:
        """This rank's optimizer state in the ``ds-flat-shard/1`` format of stages 1 and 2."""
        extra = {"zero_stage": 3, **self.step_state()}
        with self._resident_masters(write=False) as masters:
            return sharded_state(self.params, masters, self.optimizer, self.sub_groups, extra)

    def state_dict(self) -> dict:
        """Alias of ``sharded_state_dict`` as a dict ``{"tensors": ..., "meta": ...}`` (as at stages 1 and 2)."""
        tensors, meta = self.sharded_state_dict()
        return {"tensors": tensors, "meta": meta}

    def load_sharded_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Load this rank's slice (already cut for this partitioning by the caller); every rank calls it."""
        with self._resident_masters(write=True) as masters:
            load_sharded(self.params, masters, self.optimizer, self.sub_groups, tensors, meta)
        self._masters_to_parts()
        self.load_step_state(meta.get("extra", {}))

    def module_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The module's full state dict on every rank (collective), one parameter gathered at a time.

        With ``dtype`` the gathered parameters are cast (``save_16bit_model`` passes the 16-bit dtype). A tied
        parameter (one tensor under several names, e.g. an LM head tied to the embedding) is gathered once and
        every name maps to the same tensor object, as in ``module.state_dict()``: savers that drop shared
        tensors (safetensors in ``save_pretrained``) then see the tie, as under DeepSpeed.
        """
        out: dict[str, torch.Tensor] = {}
        seen: dict[int, torch.Tensor] = {}  # id(module tensor) -> its gathered copy
        for name, t in self.module.state_dict(keep_vars=True).items():
            if id(t) in seen:
                out[name] = seen[id(t)]
                continue
            slot = self.params.slot(t)
            if slot is None:
                out[name] = t.detach().cpu().clone()
            else:
                (full,) = self.params.gather_values([slot], None, slot.param.dtype)
                out[name] = full.to("cpu", dtype or full.dtype)
            seen[id(t)] = out[name]
        return out

    def fp32_state_dict(self) -> dict[str, torch.Tensor]:
        """The trained parameters' full fp32 values, gathered from the masters (collective)."""
        slots = [s for s in self.params.slots.values() if s.frozen is None]
        with self._resident_masters(write=False) as masters:
            values = self.params.gather_values(slots, masters, torch.float32)
        return {s.name: v.cpu() for s, v in zip(slots, values)}

    def gathered_16bit_state_dict(self) -> dict[str, torch.Tensor] | None:
        """For ``save_16bit_model``: the full state dict in the model dtype on rank 0, None elsewhere.

        Collective. Without ``stage3_gather_16bit_weights_on_model_save`` it returns None on every rank
        (DeepSpeed then saves nothing either).
        """
        if not self.options.gather_16bit_weights_on_model_save:
            return None
        state = self.module_state_dict()
        return state if self.rank == 0 else None

    def load_module_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Load a full state dict: each rank keeps its partition of every managed parameter."""
        own = self.module.state_dict(keep_vars=True)
        rest = {}
        for name, value in state.items():
            slot = self.params.slot(own[name]) if name in own else None
            if slot is None:
                rest[name] = value
            elif tuple(value.shape) != tuple(slot.shape):
                raise ZeroConfigError(
                    f"{name}: checkpoint shape {tuple(value.shape)}, model {tuple(slot.shape)}"
                )
            else:
                with torch.no_grad():
                    self.params.write_back(slot, value.to(slot.param.dtype))
        # frozen partitions (``_frozen``) count as missing, as unmanaged whole parameters do
        managed = {n for n, t in own.items() if (s := self.params.slot(t)) is not None and s.frozen is None}
        missing, unexpected = self.module.load_state_dict(rest, strict=False)
        missing = [n for n in missing if n not in managed and n not in state]
        if strict and (missing or unexpected):
            raise StateDictMismatchError(self.module, missing, unexpected)

    def empty_partition_cache(self) -> None:
        """DeepSpeed's ``empty_partition_cache``: free the gathered copies of every parameter not in use
        (persistent ones stay whole), e.g. before generation or evaluation on another model."""
        self.schedule.release_all()

    def remove_hooks(self) -> None:
        """Take the gather and gradient hooks off the module."""
        self.hooks.remove()
