"""MixedPrecisionOptimizer: fp32 master weights, loss scaling, fused unscale-and-clip, skipped steps."""

from __future__ import annotations

import importlib
import logging
import math
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from ds_config import LossScaleConfig

from ._flat import FlatGroup, build_flat_group
from ._scaler import DynamicLossScaler, OverflowAtMinimumScaleError
from ._state import load_flat_state, save_flat_state

__all__ = ["MixedPrecisionOptimizer"]

logger = logging.getLogger("ds_precision")

LOW_PRECISION = (torch.float16, torch.bfloat16)
CLIP_EPS = 1e-6  # docs/design.md §5: clip = ((norm / scale) + 1e-6) / max


class MixedPrecisionOptimizer:
    """Wrap any torch optimizer for fp16/bf16 (or fp32) training with fp32 master weights.

    Each param group's trainable parameters are copied into one flat fp32 buffer; the inner
    optimizer is re-pointed at per-parameter fp32 views of it, so shape-aware optimizers (LAMB,
    Adafactor-style) still see parameter shapes. In fp32 (and with ``master_weights=False``) the
    model parameters are themselves re-pointed into the flat buffer and no copies are made.

    Per step: one norm pass over the gradients gives both the overflow test (inf/nan anywhere) and
    the global norm; one host sync reads it; then one multiply unscales and clips (docs/design.md §5),
    the inner optimizer steps on fp32, and the result is copied back into the model's weights.
    On overflow nothing is updated (inner optimizer state untouched), the gradients are discarded,
    the scaler is told, and :meth:`step` returns ``False`` so the caller does not step its LR
    schedule.

    Args:
        optimizer: any torch optimizer built on the model's parameters (not LBFGS: it needs a closure).
        scaler: a loss scaler (``loss_scale``, ``update_scale``); ``None`` means no scaling, except
            for fp16 where ``None`` means a ``DynamicLossScaler()`` with the project defaults.
        dtype: the dtype the model trains in (``torch.float16``, ``torch.bfloat16`` or ``torch.float32``).
        clip_grad: clip the global gradient norm to this value; 0 disables clipping.
        process_group: the group over which gradients differ (used only when ``grads_replicated``
            is ``False``); default: the world group.
        grads_replicated: ``True`` when every rank already holds identical gradients (data parallel
            after the all-reduce): no collective is needed. ``False`` when ranks hold different
            gradients (model-parallel shards, local steps): the squared norms are summed across
            ranks with one small all-reduce, which also makes an inf/nan on any rank skip every rank.
        fp32_grad_accum: accumulate low-precision gradients into the fp32 gradient buffer after each
            backward (for gradient accumulation over micro-steps in bf16); the model's own ``.grad``
            is then released after every backward.
        master_weights: keep fp32 master weights (default). ``False`` steps the low-precision
            weights directly (amp O3, "pure half").
        module: the model, used only to name parameters in diagnostics and checkpoints.
        log_interval_steps: log how many steps were skipped once per this many steps.
        numba_kernels: bf16 on CPU only: read, unscale and write the gradients and weights in one
            pass each with Numba kernels (``pip install 'ds-precision[fast]'``), bit-identical to the
            torch ops. ``None`` (default): when numba is importable; ``True``: require it; ``False``:
            torch ops only.
        model_parallel_group: with Megatron-style model parallelism, the model-parallel group: the
            norm and the overflow test then also span it. Parameters marked ``tensor_model_parallel``
            (or ``model_parallel``) count on every model-parallel rank, all others on its rank 0 only.
        expert_params: parameters whose gradients still differ between the ranks of ``process_group``
            after the data-parallel reduction (a mixture of experts' experts at expert parallelism > 1).
            With replicated gradients the ranks' norms would then differ, so the norm follows one of
            DeepSpeed 0.19.8's stage-0 rules, the same on every rank (one small all-reduce per step):
            ``expert_norm="rank_mean"``, each rank's norm of all its gradients averaged over
            ``process_group`` (DeepSpeed's fp32 ``clip_grad_norm_``), or ``"excluded"``, the norm of the
            other gradients only (DeepSpeed's fp16/bf16 optimizer); an inf/nan anywhere skips every rank.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        scaler: Any | None = None,
        dtype: torch.dtype,
        clip_grad: float = 0.0,
        process_group: Any | None = None,
        grads_replicated: bool = True,
        fp32_grad_accum: bool = False,
        master_weights: bool = True,
        module: torch.nn.Module | None = None,
        log_interval_steps: int = 100,
        numba_kernels: bool | None = None,
        model_parallel_group: Any | None = None,
        expert_params: Iterable[torch.nn.Parameter] | None = None,
        expert_norm: str = "rank_mean",
    ) -> None:
        if dtype not in (*LOW_PRECISION, torch.float32):
            raise ValueError(f"dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype}")
        if clip_grad < 0:
            raise ValueError(f"clip_grad must be >= 0 (0 disables clipping), got {clip_grad!r}")
        if log_interval_steps < 1:
            raise ValueError(f"log_interval_steps must be >= 1, got {log_interval_steps!r}")
        if expert_norm not in ("rank_mean", "excluded"):
            raise ValueError(f"expert_norm must be 'rank_mean' or 'excluded', got {expert_norm!r}")
        alias = dtype == torch.float32 or not master_weights
        if fp32_grad_accum and alias and dtype != torch.float32:
            raise ValueError("fp32_grad_accum needs fp32 master weights: set master_weights=True")
        if scaler is None and dtype == torch.float16:
            scaler = DynamicLossScaler()
        self.optimizer = optimizer
        self.scaler = scaler
        self.dtype = dtype
        self.clip_grad = float(clip_grad)
        self.process_group = process_group
        self.grads_replicated = grads_replicated
        has_mp = dist.is_available() and dist.is_initialized() and model_parallel_group is not None
        self.mp_group = (
            model_parallel_group if has_mp and dist.get_world_size(model_parallel_group) > 1 else None
        )
        self.mp_rank = dist.get_rank(self.mp_group) if self.mp_group is not None else 0
        self.fp32_grad_accum = fp32_grad_accum and not alias
        self.log_interval_steps = log_interval_steps
        self.groups = self._flatten_groups(optimizer, module, alias)
        self.global_steps = 0  # every call to step(), skipped or not
        self.skipped_steps = 0
        self.overflow = False  # did the last step overflow
        self.global_grad_norm: float | None = None  # unscaled, of the last applied step
        self._window_steps = 0
        self._window_skipped = 0
        self._hooks = self._register_accum_hooks() if self.fp32_grad_accum else []
        if not self.fp32_grad_accum:
            # the fp32 gradient buffer lives only inside step(): the model's grads hold the gradients
            # until then (with fp32_grad_accum it is the accumulator, so it lives through the window)
            for flat in self.groups:
                flat.release_grads()
        self._reduction_params: list[torch.nn.Parameter] | None = None
        experts = {id(p) for p in expert_params or ()}
        self.expert_norm = expert_norm if experts else None
        # per group, per parameter: does it count towards the norm on this rank (docs/design.md §5)
        self._counted = [
            [
                (self.mp_rank == 0 or _is_model_parallel(p))
                and not (expert_norm == "excluded" and id(p) in experts)
                for p in flat.model_params
            ]
            for flat in self.groups
        ]
        self._kernels = _load_kernels(numba_kernels) if dtype == torch.bfloat16 and not alias else None

    # ---------------------------------------------------------------- construction
    def _flatten_groups(
        self, optimizer: torch.optim.Optimizer, module: torch.nn.Module | None, alias: bool
    ) -> list[FlatGroup]:
        names_by_id = {id(p): n for n, p in module.named_parameters()} if module is not None else {}
        groups, index = [], 0
        for group in optimizer.param_groups:
            params = [p for p in group["params"] if p.requires_grad]
            names = [names_by_id.get(id(p), f"param{index + i}") for i, p in enumerate(params)]
            index += len(group["params"])
            if not params:
                raise ValueError("an optimizer param group has no parameter that requires grad")
            flat = build_flat_group(
                params, names, alias=alias, master_dtype=torch.float32 if not alias else self.dtype
            )
            self._move_inner_state(optimizer, flat)
            group["params"] = list(flat.masters)
            groups.append(flat)
        return groups

    @staticmethod
    def _move_inner_state(optimizer: torch.optim.Optimizer, flat: FlatGroup) -> None:
        """Re-key state the inner optimizer may already hold from model params to master params."""
        for p, m in zip(flat.model_params, flat.masters):
            if p is not m and p in optimizer.state:
                old = optimizer.state.pop(p)
                optimizer.state[m] = {
                    k: v.to(torch.float32) if torch.is_tensor(v) and v.is_floating_point() and v.dim() else v
                    for k, v in old.items()
                }

    def _register_accum_hooks(self) -> list[Any]:
        hooks = []
        for flat in self.groups:
            for i, p in enumerate(flat.model_params):
                hooks.append(p.register_post_accumulate_grad_hook(self._make_accum_hook(flat, i)))
        return hooks

    @staticmethod
    def _make_accum_hook(flat: FlatGroup, i: int) -> Callable[[torch.Tensor], None]:
        view = flat.grad_views[i]
        # the parameter's C++ autograd state holds the hook, out of the garbage collector's sight: a
        # strong reference to ``flat`` (which holds the parameter) would be a cycle never collected
        flat_ref = weakref.ref(flat)

        def hook(p: torch.Tensor) -> None:
            # accumulate in fp32 so that many small bf16 micro-step grads do not lose their low bits
            view.add_(p.grad)
            p.grad = None
            owner = flat_ref()
            if owner is not None:
                owner.accumulated[i] = True

        return hook

    # ---------------------------------------------------------------- torch-optimizer surface
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's param groups (holding the fp32 master views); LR lives here."""
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        """The inner optimizer's per-parameter state (keyed by master parameters)."""
        return self.optimizer.state

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 without a scaler)."""
        return self.scaler.loss_scale if self.scaler is not None else 1.0

    @property
    def loss_scale_config(self) -> LossScaleConfig:
        """The scaler's settings and state under DeepSpeed's names, as DeepSpeed's fp16 optimizers give them
        (its own snapshot from the scaler, fresh per access; no scaling without one)."""
        return self.scaler.loss_scale_config if self.scaler is not None else LossScaleConfig.unscaled()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` in fp32 multiplied by the loss scale; call ``.backward()`` on the result."""
        scale = self.loss_scale
        return loss.float() * scale if scale != 1.0 else loss.float()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backward of the scaled loss (kwargs go to ``Tensor.backward``, e.g. ``retain_graph``)."""
        self.scale_loss(loss).backward(**kwargs)

    def reduction_params(self) -> list[torch.nn.Parameter] | None:
        """What a data-parallel reducer must average in place; ``None`` means the model's own gradients.

        With ``fp32_grad_accum`` each backward moves the model's gradients into fp32 buffers and frees
        them, so the reducer must average those buffers instead: one parameter per trainable model
        parameter, sharing its fp32 master's storage, whose ``.grad`` is always its slice of the fp32
        buffer (zeros where this rank accumulated nothing). Call :meth:`gradients_reduced` afterwards.
        """
        if not self.fp32_grad_accum:
            return None
        if self._reduction_params is None:
            self._reduction_params = []
            for flat in self.groups:
                for master, grad_view in zip(flat.masters, flat.grad_views):
                    carrier = torch.nn.Parameter(master.detach(), requires_grad=True)
                    carrier.grad = grad_view
                    self._reduction_params.append(carrier)
        return self._reduction_params

    def gradients_reduced(self) -> None:
        """Say that the fp32 buffers were averaged across ranks: every parameter now has a gradient
        (the average, zero where no rank had one), so every one of them is stepped, on every rank."""
        if self.fp32_grad_accum:
            for flat in self.groups:
                flat.accumulated = [True] * len(flat.accumulated)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Release the model's gradients and clear the fp32 accumulation buffer."""
        for flat in self.groups:
            for p in flat.model_params:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
            if self.fp32_grad_accum:
                flat.flat_grad.zero_()
                flat.accumulated = [False] * len(flat.accumulated)

    # ---------------------------------------------------------------- the step
    def step(self, closure: None = None) -> bool:
        """Unscale, clip and apply the gradients; return ``False`` when the step was skipped."""
        if closure is not None:
            raise TypeError(
                "MixedPrecisionOptimizer.step does not take a closure: run forward/backward first"
            )
        live = [self._live(flat) for flat in self.groups]
        kernels = self._kernels if self._kernels is not None and _kernel_ready(live) else None
        if kernels is None:
            self._copy_grads_to_master(live)
            # the norm of the fp32 copies: the values the update will use (and faster than reading
            # low-precision grads with an fp32 accumulator in torch on CPU)
            norm_of = [master_grads for _, master_grads, _ in live]
        else:  # the kernels read bf16 directly: the copy waits until the scale is known
            norm_of = [grads for grads, _, _ in live]
        scaled_norm = self._global_norm(*self._split_counted(live, norm_of), kernels)
        self.global_steps += 1
        self.overflow = scaled_norm is None
        if self.overflow:
            self._skip(live)
            return False
        if self.scaler is not None:
            # an overflow-free step is counted before the unscale, as in DeepSpeed 0.19.8's fp16 optimizers
            # (stage 0 and ZeRO alike): a step that grows the scale divides its gradients, and the norm it
            # reports, by the grown scale
            self.scaler.update_scale(False)
        scale = self.loss_scale
        self.global_grad_norm = scaled_norm / scale
        combined = scale
        if self.clip_grad > 0:
            clip = (self.global_grad_norm + CLIP_EPS) / self.clip_grad
            if clip > 1:
                combined = clip * scale
        if kernels is None:
            self._unscale_and_clip(live, 1.0 / combined)
        else:
            kernels.copy_scaled_to_fp32(
                [g for _, masters, _ in live for g in masters],
                [g for grads, _, _ in live for g in grads],
                1.0 / combined,
            )
        self.optimizer.step()
        self._copy_back(live, kernels)
        self._release_transient_grads()
        self._account(skipped=False)
        return True

    def _release_transient_grads(self) -> None:
        """Free the fp32 gradient buffers after a step, unless they accumulate across micro-steps."""
        if not self.fp32_grad_accum:
            for flat in self.groups:
                flat.release_grads()

    def _live(self, flat: FlatGroup) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
        """(gradients to read, their master grads, indices) for params that got a gradient."""
        if self.fp32_grad_accum:
            idx = [i for i, a in enumerate(flat.accumulated) if a]
            views = [flat.grad_views[i] for i in idx]
            for i, m in enumerate(flat.masters):
                m.grad = flat.grad_views[i] if flat.accumulated[i] else None
            return views, views, idx
        idx = [i for i, p in enumerate(flat.model_params) if p.grad is not None]
        grads = [flat.model_params[i].grad for i in idx]
        if flat.aliased:
            return grads, grads, idx
        flat.allocate_grads()  # freed again at the end of the step
        # params without a gradient must not be stepped (torch semantics: weight decay, momentum)
        have = set(idx)
        for i, m in enumerate(flat.masters):
            m.grad = flat.grad_views[i] if i in have else None
        return grads, [flat.grad_views[i] for i in idx], idx

    def _split_counted(
        self, live: list[tuple], norm_of: list[list[torch.Tensor]]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(gradients that count towards the norm, the others): with a model-parallel group, a
        parameter replicated across its ranks counts on model-parallel rank 0 only; one marked
        ``tensor_model_parallel`` (or ``model_parallel``), a shard, counts everywhere (docs/design.md §5)."""
        if (self.mp_group is None or self.mp_rank == 0) and self.expert_norm != "excluded":
            return [g for grads in norm_of for g in grads], []
        counted, replicas = [], []
        for (_, _, idx), grads, flags in zip(live, norm_of, self._counted):
            for i, g in zip(idx, grads):
                (counted if flags[i] else replicas).append(g)
        return counted, replicas

    def _global_norm(
        self, grads: list[torch.Tensor], replicas: list[torch.Tensor], kernels: Any | None = None
    ) -> float | None:
        """The L2 norm of all (still scaled) gradients across ranks, or ``None`` on inf/nan.

        ``replicas`` do not count towards the norm, but an inf/nan in them still skips the step.
        """
        if kernels is None:
            sq = self._sum_of_squares(grads, torch.float32)
            if replicas:  # 0 * inf = nan: their overflow rides along at the cost of one read
                sq += 0.0 * self._sum_of_squares(replicas, torch.float32)
        else:  # accumulated in fp64: only a real inf/nan makes it non-finite
            sq = torch.tensor(kernels.sum_of_squares(grads), dtype=torch.float64)
            if replicas:
                sq += 0.0 * kernels.sum_of_squares(replicas)
        if self.expert_norm is not None and self.grads_replicated:
            return self._expert_rule_norm(sq, grads, replicas)
        self._all_reduce(sq, dist.ReduceOp.SUM)
        total = sq.item()  # the one host sync of a step
        if math.isfinite(total):
            return math.sqrt(total)
        # rare: either a real inf/nan, or finite grads whose fp32 sum of squares overflowed
        flag = torch.tensor(
            [float(self._has_nonfinite(grads + replicas))], dtype=torch.float64, device=sq.device
        )
        self._all_reduce(flag, dist.ReduceOp.MAX)
        if flag.item():
            return None
        sq = self._sum_of_squares(grads, torch.float64)
        self._all_reduce(sq, dist.ReduceOp.SUM)
        return math.sqrt(sq.item())

    def _expert_rule_norm(
        self, sq: torch.Tensor, grads: list[torch.Tensor], replicas: list[torch.Tensor]
    ) -> float | None:
        """DeepSpeed's stage-0 norm with expert parameters (``expert_norm``), from this rank's squared norm
        ``sq``: the same on every rank of ``process_group``, ``None`` when any rank saw an inf/nan."""
        if self.mp_group is not None:
            dist.all_reduce(sq, group=self.mp_group)
        if not math.isfinite(sq.item()) and not self._has_nonfinite(grads + replicas):
            sq = self._sum_of_squares(grads, torch.float64)  # finite grads whose fp32 squares overflowed
            if self.mp_group is not None:
                dist.all_reduce(sq, group=self.mp_group)
        ranks = dist.get_world_size(self.process_group) if dist.is_initialized() else 1
        # rank_mean: the mean of the ranks' norms; excluded: the experts count 0 (their overflow rides
        # along), so every rank holds the same sum and the mean of it is that sum
        share = (sq.sqrt() if self.expert_norm == "rank_mean" else sq) / ranks
        if ranks > 1:
            dist.all_reduce(share, group=self.process_group)
        total = share.item()
        if not math.isfinite(total):
            return None
        return total if self.expert_norm == "rank_mean" else math.sqrt(total)

    def _sum_of_squares(self, grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        device = self.groups[0].flat_master.device
        if not grads:
            return torch.zeros((), dtype=torch.float64, device=device)
        norms = torch._foreach_norm(grads, 2, dtype=dtype)
        return torch.stack(norms).double().square().sum()

    @staticmethod
    def _has_nonfinite(grads: list[torch.Tensor]) -> bool:
        return any(not bool(torch.isfinite(g).all()) for g in grads)

    def _all_reduce(self, t: torch.Tensor, op: Any) -> None:
        """Over the data-parallel group when ranks hold different gradients, then over the
        model-parallel group when there is one."""
        if self.mp_group is not None:
            dist.all_reduce(t, op=op, group=self.mp_group)
        if self.grads_replicated or not dist.is_available() or not dist.is_initialized():
            return
        if dist.get_world_size(self.process_group) > 1:
            dist.all_reduce(t, op=op, group=self.process_group)

    def _copy_grads_to_master(self, live: list[tuple]) -> None:
        """Copy the model's (scaled) low-precision gradients into the fp32 master gradients."""
        if self.fp32_grad_accum:
            return  # the backward hooks already accumulated them there
        for (grads, master_grads, _), flat in zip(live, self.groups):
            if grads and not flat.aliased:
                torch._foreach_copy_(master_grads, grads)

    def _unscale_and_clip(self, live: list[tuple], inv_scale: float) -> None:
        """Spec section 5: one multiply by 1/combined both unscales and clips."""
        masters = [g for _, master_grads, _ in live for g in master_grads]
        if masters and inv_scale != 1.0:
            torch._foreach_mul_(masters, inv_scale)

    def _copy_back(self, live: list[tuple], kernels: Any | None = None) -> None:
        """Copy the updated fp32 weights into the model's low-precision weights."""
        dst, src = [], []
        with torch.no_grad():
            for (_, _, idx), flat in zip(live, self.groups):
                if flat.aliased:
                    continue
                if flat.flat_model is not None and len(idx) == len(flat.masters):
                    if kernels is not None and flat.flat_model.dtype == torch.bfloat16:
                        kernels.copy_to_bf16(flat.flat_model, flat.flat_master)
                    else:
                        flat.flat_model.copy_(flat.flat_master)  # one contiguous copy
                    continue
                dst.extend(flat.model_params[i].data for i in idx)
                src.extend(flat.masters[i].data for i in idx)
            if dst:
                torch._foreach_copy_(dst, src)

    def _skip(self, live: list[tuple]) -> None:
        self.global_grad_norm = None
        try:
            if self.scaler is not None:
                self.scaler.update_scale(True)
        except OverflowAtMinimumScaleError as err:
            raise err.with_param_names(self._nonfinite_names(live)) from None
        finally:
            self.skipped_steps += 1
            self._account(skipped=True)
            self.zero_grad()
            self._release_transient_grads()

    def _nonfinite_names(self, live: list[tuple]) -> tuple[str, ...]:
        names = []
        for (grads, _, idx), flat in zip(live, self.groups):
            names.extend(flat.names[i] for g, i in zip(grads, idx) if not bool(torch.isfinite(g).all()))
        return tuple(names)

    def _account(self, skipped: bool) -> None:
        """Count skipped steps and log them once per interval rather than once per step."""
        self._window_steps += 1
        self._window_skipped += int(skipped)
        if self._window_steps < self.log_interval_steps:
            return
        if self._window_skipped:
            logger.warning(
                "skipped %d of the last %d optimizer steps because gradients overflowed (inf/nan); "
                "loss scale now %g, %d steps skipped in total",
                self._window_skipped,
                self._window_steps,
                self.loss_scale,
                self.skipped_steps,
            )
        self._window_steps = 0
        self._window_skipped = 0

    # ---------------------------------------------------------------- checkpoints
    def sharded_state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """This wrapper's state in the ``ds-flat-shard/1`` format (the shard is the whole space)."""
        extra = {
            "loss_scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "global_steps": self.global_steps,
            "skipped_steps": self.skipped_steps,
            "clip_grad": self.clip_grad,
            "dtype": str(self.dtype).removeprefix("torch."),
        }
        return save_flat_state(self.optimizer, self.groups, extra)

    def load_sharded_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Restore from :meth:`sharded_state_dict`'s output (or a resharded read of the whole space)."""
        extra = load_flat_state(self.optimizer, self.groups, tensors, meta)
        scaler_state = extra.get("loss_scaler")
        if self.scaler is not None and scaler_state is not None:
            self.scaler.load_state_dict(scaler_state)
        self.global_steps = int(extra.get("global_steps", 0))
        self.skipped_steps = int(extra.get("skipped_steps", 0))
        with torch.no_grad():
            for flat in self.groups:
                if not flat.aliased:
                    torch._foreach_copy_([p.data for p in flat.model_params], [m.data for m in flat.masters])

    def state_dict(self) -> dict[str, Any]:
        """``{"tensors": ..., "meta": ...}``: the sharded format in one dict."""
        tensors, meta = self.sharded_state_dict()
        return {"tensors": tensors, "meta": meta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`'s output."""
        self.load_sharded_state_dict(state["tensors"], state["meta"])

    def __repr__(self) -> str:
        n = sum(f.numel for f in self.groups)
        return (
            f"MixedPrecisionOptimizer({type(self.optimizer).__name__}, dtype={self.dtype}, params={n}, "
            f"scaler={self.scaler!r}, clip_grad={self.clip_grad})"
        )


def _is_model_parallel(p: torch.nn.Parameter) -> bool:
    """Megatron marks its sharded parameters with one of these attributes."""
    return bool(getattr(p, "tensor_model_parallel", False) or getattr(p, "model_parallel", False))


def _load_kernels(wanted: bool | None) -> Any | None:
    """The Numba kernel module, or ``None`` when not wanted or (with ``wanted=None``) not installed."""
    if wanted is False:
        return None
    try:
        return importlib.import_module("ds_precision._bf16_kernels")
    except ImportError as err:
        if wanted:
            raise ImportError(
                f"numba_kernels=True needs numba ({err}): pip install 'ds-precision[fast]'"
            ) from err
        return None


def _kernel_ready(live: list[tuple]) -> bool:
    """The kernels take contiguous CPU bf16 gradients (a hook or a sparse layer may leave others)."""
    return all(
        g.device.type == "cpu"
        and g.dtype == torch.bfloat16
        and g.layout == torch.strided
        and g.is_contiguous()
        for grads, _, _ in live
        for g in grads
    )
