"""ZeRO stages 1 and 2: partitioned optimizer state (and gradients), flat buffers, CPU offload."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from ._comm import AveragingRule, ProcessGroup, flatten, global_rank, group_rank, group_size, plan_buckets
from ._errors import ZeroConfigError
from ._layout import GroupLayout
from ._protocol import LossScalerProtocol

__all__ = ["MemoryReport", "ZeroOptimizer", "SHARD_FORMAT", "TESTED_OPTIMIZERS"]

SHARD_FORMAT = "ds-flat-shard/1"
DEFAULT_BUCKET_ELEMS = 500_000_000
# Optimizers whose update is element-wise, so stepping a flat slice equals stepping whole tensors.
TESTED_OPTIMIZERS = frozenset({"Adam", "AdamW", "SGD", "Adagrad", "CPUAdam", "DeepSpeedCPUAdam", "FusedAdam"})


@dataclass(frozen=True)
class MemoryReport:
    """Bytes this rank holds, by kind."""

    param_bytes: int  # the full low-precision model (flat buffers): every rank holds it at stages 1/2
    master_param_bytes: int  # fp32 master copy of this rank's partition
    grad_bytes: int  # gradient buffers held for reduction and the step
    optimizer_state_bytes: int  # inner optimizer state (this rank's partition only)
    offloaded_bytes: int  # the part of the above that lives in CPU memory because of offload

    @property
    def total_bytes(self) -> int:
        """Sum of parameters, master copy, gradients and optimizer state."""
        return self.param_bytes + self.master_param_bytes + self.grad_bytes + self.optimizer_state_bytes


@dataclass
class _Group:
    """One optimizer param group, flattened and partitioned."""

    index: int
    params: list[nn.Parameter]
    names: list[str]
    layout: GroupLayout
    flat: torch.Tensor  # full padded low-precision buffer; params are views into it
    master: torch.Tensor  # fp32 copy of this rank's partition: the inner optimizer's only param
    grad_part: torch.Tensor  # this rank's averaged (still loss-scaled) partition gradient
    # stage 1 with contiguous_gradients or fp32 accumulation: the full local gradient accumulates here
    flat_grad: torch.Tensor | None = None
    opt_group: dict = field(default_factory=dict)
    norm_ranges: list[tuple[int, int]] | None = None  # see ZeroOptimizer._norm_ranges


@dataclass
class _Bucket:
    """Consecutive parameters of one group reduced together; ``[start, end)`` in the flat space."""

    order: int
    group: _Group
    indices: list[int]
    start: int
    end: int
    pending: int = 0
    staged: set[int] = field(default_factory=set)
    buf: torch.Tensor | None = None
    works: list = field(default_factory=list)
    launched: bool = False


class ZeroOptimizer:
    """Wrap a torch optimizer with ZeRO stage 1 (optimizer state partitioned) or 2 (and gradients).

    Each param group's trainable parameters are flattened into one low-precision buffer (padded so
    ``numel % (2*dp) == 0``) and the model's parameters become views into it. Each rank keeps an fp32
    master copy and the inner optimizer's state for its own contiguous partition only; the inner
    optimizer is re-pointed at that partition. After each step the updated partitions are gathered
    (all_gather, or broadcasts from each owner when ``allgather_partitions`` is false).

    Contract per optimizer step of ``gas`` micro-steps:
      * ``backward(loss)`` on every micro-step (the caller divides the loss by ``gas``); it scales
        the loss by the scaler's ``loss_scale``. Callers that run ``loss.backward()`` themselves must
        call ``micro_step_done()`` after each backward instead.
      * ``step()`` once at the boundary; it returns False when the step was skipped for overflow.
    Stage 1 keeps full gradients locally and reduces them at the boundary; stage 2 reduces
    bucket by bucket from gradient hooks during every micro-step's backward and keeps only its slice.
    With stage 1 and ``overlap_comm``, call ``set_boundary(is_boundary)`` before each backward: the
    hooks then launch the reductions during the boundary backward and ``step()`` finishes them
    (without the call, stage 1 reduces everything in ``step()``).

    ``grad_accum_dtype=torch.float32`` (for bf16/fp16 models) accumulates gradients in fp32: stage 2
    adds each micro-step's reduced slice into an fp32 partition gradient; stage 1 moves every
    micro-step's gradient into an fp32 flat buffer from gradient hooks and reduces that buffer in fp32.

    With ``model_parallel_group`` (Megatron-style model parallelism; ``process_group`` is then the
    data-parallel group) the global norm and the overflow test also span the model-parallel ranks:
    parameters marked ``tensor_model_parallel`` (or ``model_parallel``) count on every model-parallel
    rank, all others on model-parallel rank 0 only.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        stage: int,
        process_group: ProcessGroup | None = None,
        scaler: LossScalerProtocol | None = None,
        clip_grad: float = 0.0,
        reduce_bucket_size: int = DEFAULT_BUCKET_ELEMS,
        allgather_bucket_size: int = DEFAULT_BUCKET_ELEMS,
        overlap_comm: bool = False,
        reduce_scatter: bool = True,
        contiguous_gradients: bool = False,
        allgather_partitions: bool = True,
        cpu_offload: bool = False,
        allow_untested_optimizer: bool = False,
        gradient_predivide_factor: float = 1.0,
        prescale_gradients: bool = False,
        fp32_allreduce: bool = False,
        param_names: dict[int, str] | None = None,
        model_parallel_group: ProcessGroup | None = None,
        grad_accum_dtype: torch.dtype | None = None,
    ) -> None:
        if grad_accum_dtype not in (None, torch.float32):
            raise ZeroConfigError(
                f"grad_accum_dtype must be torch.float32 or None (the model dtype), got {grad_accum_dtype}"
            )
        _check_options(
            optimizer,
            stage,
            reduce_bucket_size,
            allgather_bucket_size,
            reduce_scatter,
            allow_untested_optimizer,
            gradient_predivide_factor,
            prescale_gradients,
            fp32_allreduce,
            clip_grad,
        )
        if not dist.is_initialized():
            raise RuntimeError(
                "ZeroOptimizer needs torch.distributed: call init_process_group first "
                "(a world of one process is fine)"
            )
        self.optimizer = optimizer
        self.stage = stage
        self.process_group = process_group
        self.scaler = scaler
        self.clip_grad = float(clip_grad)
        self.dp = group_size(process_group)
        self.rank = group_rank(process_group)
        self.reduce_bucket_size = int(reduce_bucket_size)
        self.allgather_bucket_size = int(allgather_bucket_size)
        self.overlap_comm = overlap_comm
        self.reduce_scatter = reduce_scatter
        # offload needs the grads in one place to copy them to CPU (DeepSpeed forces this too)
        self.contiguous_gradients = contiguous_gradients or cpu_offload
        self.allgather_partitions = allgather_partitions
        self.cpu_offload = cpu_offload
        self.grad_accum_dtype = grad_accum_dtype
        self.rule = AveragingRule(self.dp, prescale_gradients, gradient_predivide_factor)
        # with model parallelism the norm also sums over the model-parallel group (spec section 5)
        self.mp_group = model_parallel_group if group_size(model_parallel_group) > 1 else None
        self.mp_rank = group_rank(self.mp_group) if self.mp_group is not None else 0
        self.global_grad_norm: float | None = None
        self.skipped_steps = 0
        self._groups = [
            self._flatten_group(i, g, param_names or {}) for i, g in enumerate(optimizer.param_groups)
        ]
        optimizer.state.clear()  # any state was keyed by the old, replaced parameters
        # fp32 accumulation only does something when the model trains in a lower precision
        self._fp32_accum = any(g.grad_part.dtype != g.flat.dtype for g in self._groups)
        self._buckets = self._plan_buckets()
        self._bucket_of = {
            id(p): (b, i) for b in self._buckets for i in b.indices for p in [b.group.params[i]]
        }
        self._nslots = 2 if overlap_comm else 1
        self._slots: list[torch.Tensor] = []
        self._slot_owner: list[_Bucket | None] = [None] * self._nslots
        self._inflight: list[_Bucket] = []
        self._next_launch = 0
        self._dirty = False
        self._armed = False  # stage 1: the coming backward ends the window and overlap_comm is on
        self._stream = None
        self._hooks = []
        if stage == 2 and self.contiguous_gradients:
            width = max((b.end - b.start for b in self._buckets), default=0)
            device = self._groups[0].flat.device if self._groups else torch.device("cpu")
            dtype = self._groups[0].flat.dtype if self._groups else torch.float32
            self._slots = [torch.zeros(width, dtype=dtype, device=device) for _ in range(self._nslots)]
        if stage == 2 or overlap_comm or self._fp32_accum:
            self._hooks = [
                p.register_post_accumulate_grad_hook(self._on_grad_ready)
                for g in self._groups
                for p in g.params
            ]
        self._reset_micro_step()
        self.zero_grad()

    @classmethod
    def from_config(
        cls,
        optimizer: torch.optim.Optimizer,
        config: object,
        *,
        process_group: ProcessGroup | None = None,
        scaler: LossScalerProtocol | None = None,
        clip_grad: float = 0.0,
        allow_untested_optimizer: bool = False,
        gradient_predivide_factor: float = 1.0,
        prescale_gradients: bool = False,
        fp32_allreduce: bool = False,
        param_names: dict[int, str] | None = None,
        model_parallel_group: ProcessGroup | None = None,
        grad_accum_dtype: torch.dtype | None = None,
    ) -> ZeroOptimizer:
        """Build from the ``zero_optimization`` section model (attribute names equal the JSON keys).

        The top-level keys (``gradient_clipping``, ``zero_allow_untested_optimizer``,
        ``gradient_predivide_factor``, ``prescale_gradients``, ``fp32_allreduce``) and the accumulation
        dtype (``bf16.grad_accum_dtype``) are passed by the caller.
        """
        offload = bool(getattr(config, "cpu_offload", False))
        offload_section = getattr(config, "offload_optimizer", None)
        device = getattr(offload_section, "device", None) if offload_section is not None else None
        device = getattr(device, "value", device)  # enums carry their JSON string in .value
        if device == "nvme":
            raise ZeroConfigError(
                "zero_optimization.offload_optimizer.device 'nvme' is not supported; use 'cpu' or 'none'"
            )
        offload = offload or device == "cpu"
        return cls(
            optimizer,
            stage=int(config.stage),
            process_group=process_group,
            scaler=scaler,
            clip_grad=clip_grad,
            reduce_bucket_size=int(config.reduce_bucket_size),
            allgather_bucket_size=int(config.allgather_bucket_size),
            overlap_comm=bool(config.overlap_comm),
            reduce_scatter=bool(config.reduce_scatter),
            contiguous_gradients=bool(config.contiguous_gradients),
            allgather_partitions=bool(config.allgather_partitions),
            cpu_offload=offload,
            allow_untested_optimizer=allow_untested_optimizer,
            gradient_predivide_factor=gradient_predivide_factor,
            prescale_gradients=prescale_gradients,
            fp32_allreduce=fp32_allreduce,
            param_names=param_names,
            model_parallel_group=model_parallel_group,
            grad_accum_dtype=grad_accum_dtype,
        )

    # ------------------------------------------------------------------ setup
    def _flatten_group(self, index: int, opt_group: dict, names: dict[int, str]) -> _Group:
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
        layout = GroupLayout.build([p.shape for p in params], self.dp)
        flat = torch.zeros(layout.padded_numel, dtype=dtype, device=device)
        for i, p in enumerate(params):
            start, end = layout.param_range(i)
            flat[start:end].copy_(p.detach().reshape(-1))
            p.data = flat[start:end].view_as(p)
        ps, pe = layout.partition_range(self.rank)
        master_device = torch.device("cpu") if self.cpu_offload else device
        master = flat[ps:pe].detach().to(master_device, torch.float32, copy=True)
        if self.cpu_offload and device.type == "cuda":
            master = master.pin_memory()
        master.requires_grad_(True)
        opt_group["params"] = [master]
        # fp32 accumulation holds the accumulated gradient (stage 1: all of it; stage 2: the partition)
        accum_dtype = self.grad_accum_dtype or dtype
        flat_grad = None
        if self.stage == 1 and (self.contiguous_gradients or accum_dtype != dtype):
            flat_grad = torch.zeros(layout.padded_numel, dtype=accum_dtype, device=device)
        grad_part = torch.zeros(layout.partition_numel, dtype=accum_dtype, device=device)
        param_names = [names.get(id(p), f"group{index}.param{i}") for i, p in enumerate(params)]
        group = _Group(index, params, param_names, layout, flat, master, grad_part, flat_grad, opt_group)
        group.norm_ranges = self._norm_ranges(group)
        return group

    def _norm_ranges(self, g: _Group) -> list[tuple[int, int]] | None:
        """Ranges of this rank's partition that count towards the global norm (None: all of it).

        With a model-parallel group, a parameter replicated across model-parallel ranks counts on
        model-parallel rank 0 only; one marked ``model_parallel`` or ``tensor_model_parallel`` (a shard)
        counts on every rank (spec section 5).
        """
        if self.mp_group is None or self.mp_rank == 0:
            return None
        ps, pe = g.layout.partition_range(self.rank)
        ranges = []
        for i, p in enumerate(g.params):
            start, end = g.layout.param_range(i)
            if _is_model_parallel(p) and start < pe and end > ps:
                ranges.append((max(start, ps) - ps, min(end, pe) - ps))
        return ranges

    def _plan_buckets(self) -> list[_Bucket]:
        """Static buckets in reverse parameter order (the order backward tends to produce grads)."""
        buckets: list[_Bucket] = []
        for g in reversed(self._groups):
            order = list(range(len(g.params)))[::-1]
            for idx in plan_buckets([g.params[i].numel() for i in order], self.reduce_bucket_size):
                members = [order[j] for j in idx]
                start = g.layout.param_range(min(members))[0]
                end = g.layout.param_range(max(members))[1]
                buckets.append(_Bucket(len(buckets), g, members, start, end))
        return buckets

    # ------------------------------------------------------------------ micro-steps
    def backward(self, loss: torch.Tensor, *, retain_graph: bool = False) -> None:
        """Backward of ``loss * loss_scale`` for one micro-step (the loss is already divided by GAS)."""
        scaled = loss.float() * self.loss_scale if self.scaler is not None else loss
        scaled.backward(retain_graph=retain_graph)
        self.micro_step_done()

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 without a scaler)."""
        return float(self.scaler.loss_scale) if self.scaler is not None else 1.0

    def set_boundary(self, is_boundary: bool) -> None:
        """Say whether the coming backward ends an accumulation window (call before each backward).

        Only stage 1 with ``overlap_comm`` uses it: the boundary backward's gradient hooks then launch
        the bucket reductions, in the same fixed order on every rank. Stage 2 reduces every micro-step
        regardless, so there the call changes nothing.
        """
        if self.stage != 1:
            return
        self._armed = is_boundary and self.overlap_comm
        self._reset_micro_step()

    def micro_step_done(self) -> None:
        """Finish a micro-step's backward: at stage 2, reduce what is left and wait for all of it."""
        if self.stage != 2 or not self._dirty:
            return
        while self._next_launch < len(self._buckets):
            self._launch(self._buckets[self._next_launch])
        while self._inflight:
            self._absorb(self._inflight[0])
        self._reset_micro_step()

    def _reset_micro_step(self) -> None:
        self._next_launch = 0
        self._dirty = False
        for b in self._buckets:
            b.pending = len(b.indices)
            b.staged = set()
            b.launched = False

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        bucket, index = self._bucket_of[id(param)]
        if self.stage == 1:
            if self._fp32_accum:
                self._adopt_grad(bucket.group, index)  # bf16 grad -> fp32 buffer, freed at once
            if self._armed:
                self._count_ready(bucket)
            return
        self._dirty = True
        if self.contiguous_gradients and param.grad is not None and self._claim_slot(bucket):
            slot = self._slots[bucket.order % self._nslots]
            start, end = bucket.group.layout.param_range(index)
            slot[start - bucket.start : end - bucket.start].copy_(param.grad.reshape(-1))
            param.grad = None  # the slot holds it now: free the tensor autograd allocated
            bucket.staged.add(index)
        self._count_ready(bucket)

    def _count_ready(self, bucket: _Bucket) -> None:
        """One more gradient of ``bucket`` is final: launch every ready bucket next in the fixed order."""
        bucket.pending -= 1
        while self._next_launch < len(self._buckets) and self._buckets[self._next_launch].pending == 0:
            self._launch(self._buckets[self._next_launch])

    def _claim_slot(self, bucket: _Bucket) -> bool:
        """Reserve the staging slot of ``bucket``, unless it is still needed by a bucket not yet launched.

        Only the next ``nslots`` buckets in launch order may stage; an earlier bucket still in flight
        on the same slot is waited for first.
        """
        if bucket.order >= self._next_launch + self._nslots:
            return False
        s = bucket.order % self._nslots
        owner = self._slot_owner[s]
        if owner is bucket:
            return True
        if owner is not None:
            self._absorb(owner)  # launched earlier (launch order), so waiting cannot deadlock
        self._slot_owner[s] = bucket
        return True

    def _launch(self, b: _Bucket) -> None:
        g = b.group
        buf = self._stage1_buffer(b) if self.stage == 1 else self._stage2_buffer(b)
        stream = self._side_stream(g.flat.device)
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(g.flat.device))
            with torch.cuda.stream(stream):
                b.works = self._reduce_range(g, buf, b.start, b.end)
        else:
            b.works = self._reduce_range(g, buf, b.start, b.end)
        b.buf, b.launched = buf, True
        self._next_launch = b.order + 1
        self._inflight.append(b)
        if self.stage == 2 and not self.overlap_comm:
            self._absorb(b)  # one bucket buffer at a time; stage 1 launches all, then waits for all

    def _stage2_buffer(self, b: _Bucket) -> torch.Tensor:
        """The bucket's gradients in one flat tensor (a staging slot with contiguous_gradients); frees them."""
        g = b.group
        if self.contiguous_gradients:
            self._claim_slot(b)
            buf = self._slots[b.order % self._nslots][: b.end - b.start]
            for i in b.indices:
                if i not in b.staged:
                    start, end = g.layout.param_range(i)
                    grad = g.params[i].grad
                    target = buf[start - b.start : end - b.start]
                    target.zero_() if grad is None else target.copy_(grad.reshape(-1))
        else:
            ordered = sorted(b.indices)
            buf = flatten(
                [g.params[i].grad for i in ordered],
                [g.params[i].shape for i in ordered],
                g.flat.dtype,
                g.flat.device,
            )
        for i in b.indices:
            g.params[i].grad = None  # stage 2 keeps only its partition's slice
        return buf

    def _stage1_buffer(self, b: _Bucket) -> torch.Tensor:
        """The bucket's accumulated full gradients: a view of the flat gradient buffer, or a new flat copy."""
        g = b.group
        if g.flat_grad is None:
            ordered = sorted(b.indices)
            return flatten(
                [g.params[i].grad for i in ordered],
                [g.params[i].shape for i in ordered],
                g.flat.dtype,
                g.flat.device,
            )
        for i in b.indices:
            self._adopt_grad(g, i)
        return g.flat_grad[b.start : b.end]

    def _reduce_range(self, g: _Group, buf: torch.Tensor, start: int, end: int) -> list:
        """Sum ``buf`` (flat range ``[start, end)``) across ranks: each slice to its owner, or to all.

        With reduce_scatter, each owner's slice goes out as one ``reduce`` to that owner: on gloo this
        measured faster than ``reduce_scatter_tensor`` (which also needs equal, padded chunks); see
        docs/benchmarks/ds-zero.md.
        """
        self.rule.before(buf)
        pg = self.process_group
        if not self.reduce_scatter:
            return [dist.all_reduce(buf, group=pg, async_op=True)]
        return [
            dist.reduce(buf[lo - start : hi - start], dst=global_rank(pg, r), group=pg, async_op=True)
            for r, lo, hi in g.layout.owners(start, end)
        ]

    def _absorb(self, b: _Bucket) -> None:
        """Wait for a bucket's reduction and add this rank's slice into its partition gradient."""
        for w in b.works:
            w.wait()
        if self._stream is not None:
            torch.cuda.current_stream(b.buf.device).wait_stream(self._stream)
        self._add_owned(b.group, b.buf, b.start, b.end)
        self._inflight.remove(b)
        b.buf, b.works = None, []
        s = b.order % self._nslots
        if self._slot_owner[s] is b:
            self._slot_owner[s] = None

    def _add_owned(self, g: _Group, buf: torch.Tensor, start: int, end: int) -> None:
        ps, pe = g.layout.partition_range(self.rank)
        lo, hi = max(start, ps), min(end, pe)
        if lo < hi:
            factor = self.rule.after_factor()
            g.grad_part[lo - ps : hi - ps].add_(buf[lo - start : hi - start], alpha=factor)

    def _side_stream(self, device: torch.device):
        if not (self.overlap_comm and device.type == "cuda"):
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        return self._stream

    # ------------------------------------------------------------------ stage 1 reduction
    def _reduce_stage1(self) -> None:
        """Reduce the locally accumulated full gradients: launch what the hooks have not, then wait for all."""
        while self._next_launch < len(self._buckets):
            self._launch(self._buckets[self._next_launch])
        while self._inflight:
            self._absorb(self._inflight[0])
        self._armed = False
        self._reset_micro_step()

    def _adopt_grad(self, g: _Group, i: int) -> None:
        """Make the flat gradient buffer hold parameter ``i``'s gradient when ``.grad`` is not a view of it.

        With fp32 accumulation the low-precision grad is added into the fp32 buffer and freed; otherwise
        (a caller replaced the view) it is copied in and the view restored.
        """
        p = g.params[i]
        start, end = g.layout.param_range(i)
        view = g.flat_grad[start:end]
        if p.grad is None or p.grad.data_ptr() == view.data_ptr():
            return
        if self._fp32_accum:
            view.add_(p.grad.reshape(-1))
            p.grad = None
        else:
            view.copy_(p.grad.reshape(-1))
            p.grad = view.view_as(p)

    # ------------------------------------------------------------------ step
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients for the next accumulation window."""
        for g in self._groups:
            g.grad_part.zero_()
            g.master.grad = None
            if g.flat_grad is not None:
                g.flat_grad.zero_()
            # contiguous stage 1 lets autograd accumulate straight into the flat buffer; with fp32
            # accumulation the hooks add the low-precision grads into it instead
            views = g.flat_grad is not None and not self._fp32_accum
            for i, p in enumerate(g.params):
                start, end = g.layout.param_range(i)
                p.grad = g.flat_grad[start:end].view_as(p) if views else None

    def step(self) -> bool:
        """Optimizer step at a gradient-accumulation boundary; returns False if skipped for overflow.

        Order: reduce (stage 1) -> agree on overflow (all_reduce MAX) -> global norm over all partitions
        -> unscale and clip in one multiply -> inner step on the fp32 partition -> gather the weights.
        """
        if self.stage == 1:
            self._reduce_stage1()
        else:
            self.micro_step_done()
        norm_sq = self._global_norm_sq()
        overflow = not math.isfinite(norm_sq)
        if overflow:
            if self.scaler is not None:
                self.scaler.update_scale(True)
            self.skipped_steps += 1
            self.global_grad_norm = None
            self.zero_grad()
            return False
        scale = self.loss_scale
        scaled_norm = math.sqrt(norm_sq)
        combined = scale
        if self.clip_grad > 0:
            clip = ((scaled_norm / scale) + 1e-6) / self.clip_grad
            combined = max(clip, 1.0) * scale
        self.global_grad_norm = scaled_norm / scale
        for g in self._groups:
            g.master.grad = g.grad_part.to(g.master.device, torch.float32).mul_(1.0 / combined)
        self.optimizer.step()
        for g in self._groups:
            ps, pe = g.layout.partition_range(self.rank)
            g.flat[ps:pe].copy_(g.master.detach())
            self._gather(g)
        if self.scaler is not None:
            self.scaler.update_scale(False)
        self.zero_grad()
        return True

    def _global_norm_sq(self) -> float:
        """Squared L2 norm of all partitions' gradients (inf when any rank saw inf/nan)."""
        local = torch.zeros(2, dtype=torch.float64)
        for g in self._groups:
            ranges = g.norm_ranges if g.norm_ranges is not None else [(0, g.grad_part.numel())]
            zero = torch.zeros((), dtype=torch.float64, device=g.grad_part.device)
            local[0] += sum((g.grad_part[lo:hi].double().pow(2).sum() for lo, hi in ranges), zero).cpu()
            # every element counts for overflow, replicated or not
            local[1] = max(float(local[1]), float((~torch.isfinite(g.grad_part)).any()))
        device = self._groups[0].flat.device if self._groups else torch.device("cpu")
        # one collective for both numbers: a SUM of the 0/1 overflow flags is nonzero exactly when
        # their MAX is, so the flag rides along with the sum of squares
        both = local.to(device)
        dist.all_reduce(both, group=self.process_group)
        if self.mp_group is not None:
            dist.all_reduce(both, group=self.mp_group)
        if both[1] > 0 or not math.isfinite(float(both[0])):
            return math.inf
        return float(both[0])

    def _gather(self, g: _Group) -> None:
        """Give every rank the updated partitions of all owners, in chunks of allgather_bucket_size."""
        part = g.layout.partition_numel
        chunk = max(1, self.allgather_bucket_size // self.dp)
        pg = self.process_group
        for k0 in range(0, part, chunk):
            k1 = min(part, k0 + chunk)
            views = [g.flat[r * part + k0 : r * part + k1] for r in range(self.dp)]
            if self.allgather_partitions:
                dist.all_gather(views, views[self.rank].clone(), group=pg)
            else:
                works = [
                    dist.broadcast(views[r], src=global_rank(pg, r), group=pg, async_op=True)
                    for r in range(self.dp)
                ]
                for w in works:
                    w.wait()

    # ------------------------------------------------------------------ reporting and state
    def memory_report(self) -> MemoryReport:
        """Bytes of parameters, gradients and optimizer state held by this rank."""
        params = sum(_nbytes(g.flat) for g in self._groups)
        master = sum(_nbytes(g.master) for g in self._groups)
        grads = sum(_nbytes(g.grad_part) for g in self._groups) + sum(_nbytes(s) for s in self._slots)
        for g in self._groups:
            if g.flat_grad is not None:
                grads += _nbytes(g.flat_grad)
            else:
                grads += sum(_nbytes(p.grad) for p in g.params if p.grad is not None)
            if g.master.grad is not None:
                grads += _nbytes(g.master.grad)
        state = sum(
            _nbytes(v) for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v)
        )
        offloaded = master + state if self.cpu_offload else 0
        return MemoryReport(params, master, grads, state, offloaded)

    @property
    def param_groups(self) -> list[dict]:
        """The inner optimizer's param groups (for LR schedulers); each holds one fp32 partition."""
        return self.optimizer.param_groups

    def sharded_state_dict(self) -> tuple[dict[str, torch.Tensor], dict]:
        """This rank's optimizer state in the "ds-flat-shard/1" format (padding stripped)."""
        tensors: dict[str, torch.Tensor] = {}
        groups_meta = []
        tensor_scalars: set[str] = set()
        for g in self._groups:
            s0, s1 = g.layout.shard(self.rank)
            local = slice(
                s0 - g.layout.partition_range(self.rank)[0], s1 - g.layout.partition_range(self.rank)[0]
            )
            tensors[f"g{g.index}.master"] = g.master.detach()[local].cpu().clone()
            scalars = {}
            for key, value in self.optimizer.state.get(g.master, {}).items():
                if torch.is_tensor(value) and value.numel() == g.master.numel() and value.dim() == 1:
                    tensors[f"g{g.index}.{key}"] = value.detach()[local].cpu().clone()
                elif torch.is_tensor(value) and value.numel() == 1:
                    scalars[key] = value.item()
                    tensor_scalars.add(key)
                elif isinstance(value, int | float | bool):
                    scalars[key] = value
                else:
                    raise ZeroConfigError(
                        f"optimizer state {key!r} of group {g.index} is neither element-wise "
                        "nor a scalar, so it cannot be sharded"
                    )
            groups_meta.append(
                {
                    "numel": g.layout.numel,
                    "shard": [s0, s1],
                    "params": [
                        {"name": n, "shape": list(p.shape), "offset": off}
                        for n, p, off in zip(g.names, g.params, g.layout.offsets)
                    ],
                    "hparams": {k: _jsonable(v) for k, v in g.opt_group.items() if k != "params"},
                    "scalars": scalars,
                }
            )
        extra = {
            "zero_stage": self.stage,
            "clip_grad": self.clip_grad,
            "tensor_scalars": sorted(tensor_scalars),
            "skipped_steps": self.skipped_steps,
            "loss_scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }
        meta = {
            "format": SHARD_FORMAT,
            "world_size": self.dp,
            "rank": self.rank,
            "groups": groups_meta,
            "extra": extra,
        }
        return tensors, meta

    def load_sharded_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Load this rank's NEW slice (already resharded by the caller); collective: every rank calls it."""
        if meta.get("format") != SHARD_FORMAT:
            raise ZeroConfigError(f"optimizer shard format {meta.get('format')!r} is not {SHARD_FORMAT!r}")
        if len(meta["groups"]) != len(self._groups):
            raise ZeroConfigError(
                f"checkpoint has {len(meta['groups'])} param groups, the optimizer has "
                f"{len(self._groups)}; build the optimizer with the same groups"
            )
        tensor_scalars = set(meta.get("extra", {}).get("tensor_scalars", []))
        for g, gm in zip(self._groups, meta["groups"]):
            self._load_group(g, gm, tensors, tensor_scalars)
            ps, pe = g.layout.partition_range(self.rank)
            g.flat[ps:pe].copy_(g.master.detach())
            self._gather(g)
        extra = meta.get("extra", {})
        if self.scaler is not None and extra.get("loss_scaler") is not None:
            self.scaler.load_state_dict(extra["loss_scaler"])

    def _load_group(
        self, g: _Group, gm: dict, tensors: dict[str, torch.Tensor], tensor_scalars: set[str]
    ) -> None:
        if gm["numel"] != g.layout.numel:
            raise ZeroConfigError(
                f"param group {g.index}: checkpoint holds {gm['numel']} elements, the model "
                f"{g.layout.numel}; the model's trainable parameters must match"
            )
        s0, s1 = g.layout.shard(self.rank)
        ps = g.layout.partition_range(self.rank)[0]
        prefix = f"g{g.index}."
        state: dict = {}
        for key, t in tensors.items():
            if not key.startswith(prefix):
                continue
            if t.numel() != s1 - s0:
                raise ZeroConfigError(
                    f"{key} has {t.numel()} elements but rank {self.rank} owns [{s0}, {s1}) "
                    "of the group: pass this rank's slice of the new partitioning"
                )
            full = torch.zeros(g.master.numel(), dtype=t.dtype, device=g.master.device)
            full[s0 - ps : s1 - ps].copy_(t.reshape(-1))
            name = key[len(prefix) :]
            if name == "master":
                with torch.no_grad():
                    g.master.copy_(full)
            else:
                state[name] = full
        for key, value in gm.get("scalars", {}).items():
            state[key] = torch.tensor(float(value), dtype=torch.float32) if key in tensor_scalars else value
        if state:
            self.optimizer.state[g.master] = state
        for key, value in gm.get("hparams", {}).items():
            if key in g.opt_group:
                current = g.opt_group[key]
                g.opt_group[key] = tuple(value) if isinstance(current, tuple) else value

    def state_dict(self) -> dict:
        """Alias of ``sharded_state_dict`` as a dict ``{"tensors": ..., "meta": ...}``."""
        tensors, meta = self.sharded_state_dict()
        return {"tensors": tensors, "meta": meta}

    def remove_hooks(self) -> None:
        """Detach the gradient hooks (stage 2, stage 1 with overlap_comm or fp32 accumulation)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _check_options(
    optimizer,
    stage,
    reduce_bucket_size,
    allgather_bucket_size,
    reduce_scatter,
    allow_untested_optimizer,
    predivide,
    prescale,
    fp32_allreduce,
    clip_grad,
) -> None:
    if stage not in (1, 2):
        raise ZeroConfigError(
            f"ZeroOptimizer runs ZeRO stages 1 and 2, got stage {stage}: stage 0 is "
            "GradientReducer; stage 3 is not supported"
        )
    if optimizer is None:
        raise ZeroConfigError(f"zero stage {stage} requires an optimizer")
    name = type(optimizer).__name__
    if (
        name not in TESTED_OPTIMIZERS
        and not getattr(optimizer, "ds_zero_elementwise", False)
        and not allow_untested_optimizer
    ):
        raise ZeroConfigError(
            f"optimizer {name} is not tested with ZeRO (tested: {', '.join(sorted(TESTED_OPTIMIZERS))}); "
            "ZeRO steps flat slices, which is only correct for element-wise updates. Set "
            '"zero_allow_untested_optimizer": true to use it anyway'
        )
    if fp32_allreduce:
        raise ZeroConfigError(
            "ZeRO does not support 'fp32_allreduce': true; remove the key (ZeRO keeps fp32 "
            "master weights, and reduces in the model dtype)"
        )
    if stage == 2 and reduce_scatter and predivide != 1.0:
        raise ZeroConfigError(
            "gradient_predivide_factor != 1.0 is not yet supported with ZeRO-2 with reduce "
            "scatter enabled: set gradient_predivide_factor to 1.0 or reduce_scatter to false"
        )
    if stage == 2 and reduce_scatter and prescale:
        raise ZeroConfigError(
            "pre-scale gradients is not yet supported with ZeRO-2 with reduce scatter enabled: "
            "set prescale_gradients to false or reduce_scatter to false"
        )
    if predivide <= 0:
        raise ZeroConfigError(f"gradient_predivide_factor must be > 0, got {predivide}")
    for key, value in (
        ("reduce_bucket_size", reduce_bucket_size),
        ("allgather_bucket_size", allgather_bucket_size),
    ):
        if int(value) < 1:
            raise ZeroConfigError(f"zero_optimization.{key} must be a positive element count, got {value}")
    if clip_grad < 0:
        raise ZeroConfigError(f"gradient_clipping must be >= 0 (0 disables it), got {clip_grad}")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _jsonable(value):
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if torch.is_tensor(value):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, int | float | bool | str) or value is None:
        return value
    return repr(value)


def _is_model_parallel(p: nn.Parameter) -> bool:
    """Megatron marks its sharded parameters with one of these attributes."""
    return bool(getattr(p, "model_parallel", False) or getattr(p, "tensor_model_parallel", False))


def names_of(module: nn.Module) -> dict[int, str]:
    """``param_names`` for ZeroOptimizer: ``id(param) -> qualified name`` of a module's parameters."""
    return {id(p): n for n, p in module.named_parameters()}
