"""ZeRO stages 1 and 2: the optimizer wrapper that ties partitioning, reduction, the step and state together."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping

import torch
import torch.distributed as dist
from ds_config import DSConfig
from torch import nn

from . import _transport
from ._comm import AveragingRule, ProcessGroup, group_rank, group_size
from ._errors import ZeroAssertionError, ZeroConfigError
from ._fragments import Fragment, ParamFragments, ParamSpan, attach_owner, state_piece
from ._memory import MemoryReport, memory_report
from ._options import ZeroOptions, check_options
from ._partition import FlatGroup, build_group
from ._partition_reduce import PartitionReducer
from ._protocol import LossScalerProtocol
from ._state import load_sharded_state, sharded_state
from ._step import LossScaledStep, gather_partitions, global_norm_sq

__all__ = ["ZeroOptimizer", "names_of"]


class ZeroOptimizer(LossScaledStep, ParamFragments):
    """Wrap a torch optimizer with ZeRO stage 1 (optimizer state partitioned) or 2 (and gradients).

    Each param group's trainable parameters are flattened into one buffer of the model dtype (padded so
    ``numel % (2*dp) == 0``) and the model's parameters become views into it (``_partition``). Each rank
    keeps fp32 master weights and the inner optimizer's state for its own contiguous partition only; the
    inner optimizer is re-pointed at that partition. Gradients are reduced bucket by bucket to their
    owners (``_partition_reduce``); the step (``_step``) agrees on overflow and the global norm, unscales
    and clips in one multiply, steps the partition, and gathers the updated weights.

    Contract per optimizer step of ``gas`` micro-steps:
      * ``set_boundary(is_boundary)`` before each backward (optional; with ``overlap_comm`` at stage 1 the
        boundary backward then launches the reductions);
      * ``backward(loss)`` on every micro-step (the caller divides the loss by ``gas``); it scales the
        loss by the scaler's ``loss_scale``. Callers that run ``loss.backward()`` themselves call
        ``micro_step_done()`` after each backward instead;
      * ``step()`` once at the boundary; it returns False when the step was skipped for overflow.

    Gradients count only when they arrive inside this optimizer's ``backward`` (or a backward declared
    with ``micro_step_done``). One that reaches a parameter elsewhere (another engine's backward) stays in
    ``.grad``: ``module.zero_grad()`` clears it and the next ``backward`` adds to it, as at stage 0. One
    that arrives after the last backward of the window is an error at ``step()``, naming the parameter.

    With ``model_parallel_group`` (``process_group`` is then the data-parallel group) the global norm
    and the overflow test also span the model-parallel ranks: parameters marked
    ``tensor_model_parallel`` (or ``model_parallel``) count on every model-parallel rank, all others on
    model-parallel rank 0 only.

    ``partition_groups`` maps a param group's index to another process group, a subgroup of
    ``process_group``'s ranks that is partitioned, reduced and gathered over instead: a mixture of
    experts' expert parameters, which differ between expert-parallel ranks, go over their
    expert-data-parallel group (the ranks holding the same experts), as DeepSpeed's ``real_dp_process_group``.
    Their gradients are still divided by ``process_group``'s size (an expert's gradient already holds the
    tokens of every expert-parallel rank), and the norm still sums over ``process_group``: each expert's
    partitions lie on the ranks of one expert-data-parallel group, so every element counts once.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        options: ZeroOptions | None = None,
        *,
        process_group: ProcessGroup | None = None,
        scaler: LossScalerProtocol | None = None,
        param_names: dict[int, str] | None = None,
        model_parallel_group: ProcessGroup | None = None,
        partition_groups: Mapping[int, ProcessGroup] | None = None,
    ) -> None:
        opts = options if options is not None else ZeroOptions()
        check_options(optimizer, opts)
        if not dist.is_initialized():
            raise RuntimeError(
                "ZeroOptimizer needs torch.distributed: call init_process_group first "
                "(a world of one process is fine)"
            )
        self.optimizer = optimizer
        self.options = opts
        self.stage = opts.stage
        self.clip_grad = float(opts.clip_grad)
        self.process_group = process_group
        self.scaler = scaler
        self.dp = group_size(process_group)
        self.rank = group_rank(process_group)
        self.host_transport = _transport.enable(process_group)  # MPI or shared memory (``_transport.py``)
        self.partition_groups = _check_partition_groups(partition_groups, optimizer, process_group)
        for pg in {id(pg): pg for pg in self.partition_groups.values()}.values():
            _transport.enable(pg)  # collective over ``pg``: its ranks build their optimizers together
        # with model parallelism the norm also sums over the model-parallel group (docs/design.md §5)
        self.mp_group = model_parallel_group if group_size(model_parallel_group) > 1 else None
        mp_rank = group_rank(self.mp_group) if self.mp_group is not None else None
        self.global_grad_norm: float | None = None
        self.skipped_steps = 0
        self._steps_taken = 0
        self._boundary = False
        groups = [self.partition_groups.get(i, process_group) for i in range(len(optimizer.param_groups))]
        self.groups: list[FlatGroup] = [
            build_group(i, g, param_names or {}, opts, group_size(pg), group_rank(pg), mp_rank, pg)
            for (i, g), pg in zip(enumerate(optimizer.param_groups), groups)
        ]
        optimizer.state.clear()  # any state was keyed by the old, replaced parameters
        self._spans = {
            id(p): ParamSpan(g.index, g.layout, g.rank, *g.layout.param_range(i), p.shape)
            for g in self.groups
            for i, p in enumerate(g.params)
        }
        attach_owner((p for g in self.groups for p in g.params), self)
        self._window_reduced = False  # stage 1: reduced before the step (a gradient was read or set)
        self._window_has_backward = False  # a backward of this window ran (on every rank alike)
        rule = AveragingRule(
            self.dp, opts.prescale_gradients, opts.gradient_predivide_factor, opts.gradient_average
        )
        self._reducer = PartitionReducer(self.groups, opts, rule, process_group)
        # ds_optim's CPUAdam writes the updated weights into the model dtype in the same pass as the
        # update (step(lowp_params=...)); then copying the master back afterwards would do it twice
        self._optimizer_writes_weights = _accepts_lowp_params(optimizer) and all(
            not g.master_is_view and g.master.device == g.flat.device for g in self.groups
        )
        if opts.cpu_offload and opts.pin_memory and not torch.cuda.is_available():
            warnings.warn(
                "zero_optimization.offload_optimizer.pin_memory has no effect here: page-locked memory "
                "only speeds copies between CPU and a CUDA device, and this torch has no CUDA (the "
                "offloaded state lives in ordinary CPU memory)",
                stacklevel=2,
            )
        self.zero_grad()

    @classmethod
    def from_config(
        cls,
        optimizer: torch.optim.Optimizer,
        config: DSConfig,
        *,
        process_group: ProcessGroup | None = None,
        scaler: LossScalerProtocol | None = None,
        param_names: dict[int, str] | None = None,
        model_parallel_group: ProcessGroup | None = None,
        partition_groups: Mapping[int, ProcessGroup] | None = None,
    ) -> ZeroOptimizer:
        """Build from a loaded config: ``zero_optimization`` and the top-level keys ZeRO reads (CONFIG_FIELDS)."""
        return cls(
            optimizer,
            ZeroOptions.from_config(config),
            process_group=process_group,
            scaler=scaler,
            param_names=param_names,
            model_parallel_group=model_parallel_group,
            partition_groups=partition_groups,
        )

    # ------------------------------------------------------------------ micro-steps
    def set_boundary(self, is_boundary: bool) -> None:
        """Say whether the coming backward ends an accumulation window (stage 1 + overlap_comm uses it)."""
        self._boundary = is_boundary

    def backward(self, loss: torch.Tensor, *, retain_graph: bool = False) -> None:
        """Backward of ``loss * loss_scale`` for one micro-step (the loss is already divided by GAS).

        The gradient hooks act only during this call; at stage 2 it returns with the micro-step reduced.
        """
        scaled = self._scaled_loss(loss)
        self._reopen_window()
        self._point_grads_into_flat_buffers()
        self._reducer.begin_backward(self._boundary)
        try:
            scaled.backward(retain_graph=retain_graph)
        except BaseException:
            self._reducer.schedule.disarm()
            raise
        self._reducer.end_backward()

    def micro_step_done(self) -> None:
        """Declare the backward the caller ran itself as this optimizer's (use instead of ``backward``).

        Stage 2 reduces its gradients now; stage 1 keeps them for the boundary (moving them into the fp32
        buffer first with fp32 accumulation).
        """
        r = self._reducer
        self._reopen_window()
        r.outside.clear()
        r.got_grad.update(id(p) for g in self.groups for p in g.params if p.grad is not None)
        if self.stage == 2:
            r.flush()
        elif r.fp32_accum:
            for g in self.groups:
                for i in range(len(g.params)):
                    r._adopt_grad(g, i)

    # ------------------------------------------------------------------ step
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients for the next accumulation window (the partition gradient is freed)."""
        for g in self.groups:
            g.grad_part = None
            g.master.grad = None
            g.flat_grad = None
            for p in g.params:
                p.grad = None
        self._reducer.got_grad.clear()
        self._window_reduced = False
        self._window_has_backward = False

    def _point_grads_into_flat_buffers(self) -> None:
        """Contiguous stage 1: before a window's backward, point each ``.grad`` that is None at its slice of
        the window's flat buffer, so autograd accumulates straight into it (with fp32 accumulation the
        hooks add the low-precision grads into it instead). The buffer lives only until the step."""
        if self.stage != 1 or self._reducer.fp32_accum:
            return
        for g in self.groups:
            if g.flat_grad_dtype is None:
                continue
            flat_grad = g.flat_grad_for_window()
            for i, p in enumerate(g.params):
                if p.grad is None:
                    start, end = g.layout.param_range(i)
                    p.grad = flat_grad[start:end].view_as(p)

    def step(self) -> bool:
        """Optimizer step at a gradient-accumulation boundary; returns False if skipped for overflow.

        Order: reduce (stage 1) -> agree on overflow and the global norm in one all-reduce SUM -> unscale
        and clip in one multiply -> inner step on the fp32 partition -> gather the weights.
        """
        self._check_late_gradients()
        self._reduce_window()
        if self.options.cpu_offload and not self.options.ignore_unused_parameters:
            self._check_unused()  # DeepSpeed checks at every step, and only with optimizer offload
        divisor = self._begin_step(global_norm_sq(self.groups, self.process_group, self.mp_group))
        # the partition's reduced gradient is in grad_part: stage 1's full flat gradient is read no more
        for g in self.groups:
            if g.flat_grad is not None:
                g.flat_grad = None
                for p in g.params:
                    p.grad = None
        if divisor is None:
            return False
        for g in self.groups:
            grad = g.grad_part_for_update().to(g.master.device, torch.float32)  # no copy when fp32 in place
            g.master.grad = grad.mul_(1.0 / divisor) if divisor != 1.0 else grad
            g.grad_part = None
        if self._optimizer_writes_weights:
            self.optimizer.step(lowp_params=[g.flat[slice(*g.partition)] for g in self.groups])
        else:
            self.optimizer.step()
        for g in self.groups:
            g.master.grad = None
            if not self._optimizer_writes_weights:
                g.write_master_back()
            gather_partitions(
                g, g.process_group, self.options.allgather_bucket_size, self.options.allgather_partitions
            )
        self._steps_taken += 1
        self._end_step()
        return True

    def _check_late_gradients(self) -> None:
        """Refuse gradients that arrived after this window's last backward: stage 0 would apply them unaveraged."""
        r = self._reducer
        if self.stage == 2:
            late = [n for g in self.groups for n, p in zip(g.names, g.params) if p.grad is not None]
        else:
            late = [
                n
                for g in self.groups
                for n, p in zip(g.names, g.params)
                if id(p) in r.outside and p.grad is not None
            ]
        if late:
            raise ZeroConfigError(
                f"ZeRO stage {self.stage}: gradients reached {', '.join(late)} after this engine's last "
                "backward and before its step() (from another backward, e.g. another engine's). Stage 0 "
                "would apply them to this rank only, without averaging. Clear them with "
                "module.zero_grad() before step(), or run that backward before this engine's backward "
                "(a script that runs loss.backward() itself must call micro_step_done() after it)"
            )

    def _check_unused(self) -> None:
        """``ignore_unused_parameters: false`` with offload: name every parameter without a gradient this window.

        DeepSpeed makes this check only where it computes the gradient norm on offloaded partitions (ZeRO 1
        and 2 with ``offload_optimizer``), as an ``assert``; without offload an unused parameter is fine.
        """
        got = self._reducer.got_grad
        unused = [n for g in self.groups for n, p in zip(g.names, g.params) if id(p) not in got]
        if unused:
            raise ZeroAssertionError(
                f"zero_optimization.ignore_unused_parameters is false and {len(unused)} parameter(s) got no "
                f"gradient in this step: {', '.join(unused)}. Use them in the loss, freeze them "
                "(requires_grad=False), or set ignore_unused_parameters to true"
            )

    def _reduce_window(self) -> None:
        """Stage 1 reduces the window's gradients at the step, or earlier when one is read or set; once."""
        if self.stage == 1 and not self._window_reduced:
            self._reducer.flush()
            self._window_reduced = True

    def _reopen_window(self) -> None:
        """A backward of the window begins. After an early stage-1 reduction the accumulated gradients are
        reduced again at the step, so the partition gradient of the first reduction is dropped rather than
        counted twice."""
        if self._window_reduced:
            for g in self.groups:
                g.grad_part = None
            self._window_reduced = False
        self._window_has_backward = True

    # ------------------------------------------------------------------ one parameter (ParamFragments)
    def _span(self, param: nn.Parameter) -> ParamSpan:
        span = self._spans.get(id(param))
        if span is None:
            raise ZeroConfigError(
                "this ZeRO optimizer does not train that parameter (frozen, or another model's)"
            )
        return span

    def _device(self, span: ParamSpan) -> torch.device:
        return self.groups[span.group].flat.device

    def _span_group(self, span: ParamSpan) -> ProcessGroup | None:
        return self.groups[span.group].process_group

    def _read_piece(self, span: ParamSpan, what: Fragment, key: str | None) -> torch.Tensor | None:
        g = self.groups[span.group]
        lo, hi = span.local()
        if what == "fp32":
            return g.master.detach()[lo:hi]
        if what == "grad":
            return None if g.grad_part is None else g.grad_part[lo:hi]
        return state_piece(self.optimizer.state.get(g.master, {}), str(key), lo, hi, "the ZeRO optimizer")

    def _write_piece(self, span: ParamSpan, what: Fragment, key: str | None, values: torch.Tensor) -> None:
        g = self.groups[span.group]
        lo, hi = span.local()
        with torch.no_grad():
            if what == "fp32":
                g.master[lo:hi].copy_(values)
            elif what == "grad":
                g.grad_part_for_update()[lo:hi].copy_(values)
            else:
                state_piece(
                    self.optimizer.state.get(g.master, {}), str(key), lo, hi, "the ZeRO optimizer"
                ).copy_(values)

    def _prepare(self, what: Fragment) -> None:
        """Stage 1 reduces the window's gradients before one is read or set (a collective: every rank
        runs it, holding a piece of the parameter or not); a set after the step's reduction would be
        added to. A window without a backward has no gradient: nothing is reduced (the read gives None)."""
        if what == "grad" and self._window_has_backward:
            self._reduce_window()

    def _after_full_write(self, param: nn.Parameter, span: ParamSpan, value: torch.Tensor) -> None:
        """fp32 weights are their own master: every rank's replica takes the value now, so the ranks agree.
        A separate master reaches the weights at the next step, as in DeepSpeed."""
        if self.groups[span.group].master_is_view:
            with torch.no_grad():
                param.data.copy_(value.reshape(param.shape))

    # ------------------------------------------------------------------ reporting and state
    def memory_report(self) -> MemoryReport:
        """Bytes of parameters, gradients and optimizer state held by this rank."""
        return memory_report(self)

    def staging_buffers(self) -> list[torch.Tensor]:
        """Preallocated gradient buffers (contiguous stage 2)."""
        return self._reducer.staging_buffers

    def sharded_state_dict(self) -> tuple[dict[str, torch.Tensor], dict]:
        """This rank's optimizer state in the "ds-flat-shard/1" format (padding stripped).

        A group of ``partition_groups`` has its shard in its own partitioning (this rank's part over that
        group's ranks), and its parameters differ between the groups' copies (experts): saving it with
        the others takes a space every rank can describe, which ds-engine's MoE checkpoints lay out."""
        return sharded_state(self)

    def load_sharded_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Load this rank's NEW slice (already resharded by the caller); collective: every rank calls it."""
        load_sharded_state(self, tensors, meta)

    def state_dict(self) -> dict:
        """Alias of ``sharded_state_dict`` as a dict ``{"tensors": ..., "meta": ...}``."""
        tensors, meta = self.sharded_state_dict()
        return {"tensors": tensors, "meta": meta}

    def remove_hooks(self) -> None:
        """Detach the gradient hooks."""
        self._reducer.remove_hooks()


def _check_partition_groups(
    partition_groups: Mapping[int, ProcessGroup] | None,
    optimizer: torch.optim.Optimizer,
    process_group: ProcessGroup | None,
) -> dict[int, ProcessGroup]:
    """The param groups partitioned over their own process group, checked: known indices, and subgroups of
    ``process_group`` (their ranks' optimizers divide by its size and sum the norm over it)."""
    chosen = {int(i): pg for i, pg in (partition_groups or {}).items() if pg is not None}
    unknown = sorted(i for i in chosen if not 0 <= i < len(optimizer.param_groups))
    if unknown:
        raise ZeroConfigError(
            f"partition_groups names param groups {unknown}, but the optimizer has "
            f"{len(optimizer.param_groups)} (indices from 0)"
        )
    if chosen and dist.is_initialized():
        dense = set(dist.get_process_group_ranks(process_group or dist.group.WORLD))
        for i, pg in chosen.items():
            ranks = set(dist.get_process_group_ranks(pg))
            if not ranks <= dense:
                raise ZeroConfigError(
                    f"partition_groups[{i}] holds ranks {sorted(ranks - dense)} outside the data-parallel "
                    "process group; a param group can only be partitioned over a subgroup of it"
                )
    return chosen


def _accepts_lowp_params(optimizer: torch.optim.Optimizer) -> bool:
    """Does ``optimizer.step`` take ``lowp_params`` (ds_optim.CPUAdam's one-pass copy into the model dtype)?"""
    try:
        return "lowp_params" in inspect.signature(optimizer.step).parameters
    except (TypeError, ValueError):
        return False


def names_of(module: nn.Module) -> dict[int, str]:
    """``param_names`` for ZeroOptimizer: ``id(param) -> qualified name`` of a module's parameters."""
    return {id(p): n for n, p in module.named_parameters()}
