"""The engine: DeepSpeed's training-loop semantics over the parts ``assemble`` built."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ds_checkpoint
import ds_precision
import ds_tpsp.tensor
import torch
from ds_config import BatchSizes, DSConfig, derive_batch_sizes
from ds_launch import Topology
from torch import nn

from ds_engine._assemble import Parts
from ds_engine._data import build_dataloader
from ds_engine._getters import ConfigGetters
from ds_engine._grad_guard import OutsideGradients
from ds_engine._key_getters import KeyGetters
from ds_engine._missing import FeatureNotAvailableError, missing_function
from ds_engine._moe_checkpoint import ExpertNames
from ds_engine._monitor import Monitor
from ds_engine._timers import BACKWARD, BACKWARD_INNER, BACKWARD_REDUCE, FORWARD, STEP, WallClockTimers
from ds_engine._tp_checkpoint import local_optimizer_state, logical_optimizer_state

logger = logging.getLogger("ds_engine")


class NoOptimizerError(AssertionError):
    """backward() or step() on an engine built without an optimizer (an engine for evaluation), DeepSpeed's
    AssertionError."""


class NoSyncError(AssertionError, RuntimeError):
    """A misuse of ``no_sync()`` (at ZeRO 2/3, nested, ``step()`` inside): DeepSpeed raises AssertionError;
    it is also a RuntimeError, which ds raised before."""


class DeepSpeedEngine(ConfigGetters, KeyGetters, nn.Module):
    """Wraps the model; ``forward``, ``backward(loss)`` and ``step()`` follow DeepSpeed's semantics.

    Every ``step()`` call is one micro-step. The optimizer, the LR schedule and the counters act only at
    a gradient-accumulation boundary (every ``gradient_accumulation_steps`` micro-steps). A step skipped
    for fp16 overflow updates nothing, does not step the LR schedule, and counts in ``skipped_steps``
    (``global_steps`` still advances, as in DeepSpeed).

    Attributes the engine does not have are looked up on the wrapped module, as DeepSpeed does, so
    ``engine.generate(...)`` or ``engine.config_class`` reach the model.
    """

    def __init__(
        self, parts: Parts, config: DSConfig, topology: Topology, training_dataloader: Any = None
    ) -> None:
        super().__init__()
        self.module = parts.model
        self.parts = parts
        self.ds_config = config  # the typed config everything here reads
        self._config_dict: dict[str, Any] | None = None
        self.topology = topology
        self.optimizer = parts.optimizer
        self.basic_optimizer = parts.basic_optimizer
        self.lr_scheduler = parts.scheduler
        self.training_dataloader = training_dataloader
        self.micro_steps = 0
        self.global_steps = 0
        self.global_samples = 0
        self.skipped_steps = 0
        self._boundary_override: bool | None = None
        self._step_applied = True
        self._inside_no_sync = False
        self._kept_local = False  # the last backward ran inside no_sync(): its gradients were not reduced
        # gradients from a backward the script ran itself are refused by step() (see _grad_guard)
        self._outside = OutsideGradients(parts.model)
        self.monitor = Monitor.from_config(config, topology.rank)
        # DeepSpeed's MoE attributes: whether the model has MoE layers, and each layer's expert count
        self.moe_layers = parts.moe.layers if parts.moe is not None else []
        self.has_moe_layers = bool(self.moe_layers)
        self.num_experts = [m.num_experts for m in self.moe_layers]
        self.timers = WallClockTimers(config.wall_clock_breakdown, topology.device)
        if config.dump_state and topology.rank == 0:
            self.dump_state()

    # ------------------------------------------------------------------ sizes and counters
    def train_batch_size(self) -> int:
        return self.ds_config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.ds_config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self.ds_config.gradient_accumulation_steps

    def set_train_batch_size(self, train_batch_size: int) -> None:
        """Change the global batch by changing gradient accumulation (the micro batch stays), as DeepSpeed."""
        per_step = self.train_micro_batch_size_per_gpu() * self.world_size
        if train_batch_size % per_step != 0:
            raise ValueError(
                f"Train batch size must be divisible by micro-batch data parallelism: {train_batch_size} is "
                f"not a multiple of micro batch {self.train_micro_batch_size_per_gpu()} x {self.world_size} ranks"
            )
        self._set_batch_sizes(derive_batch_sizes(train_batch_size, self.train_micro_batch_size_per_gpu(), None,
                                                 self.world_size, "the engine's data-parallel group"))  # fmt: skip

    def _set_batch_sizes(self, sizes: BatchSizes) -> None:
        """The one way the batch triple changes after ``initialize``: a triple ds-config derived and checked,
        written together; ``engine.config`` is rebuilt from it on its next read."""
        c = self.ds_config
        c.train_batch_size = sizes.train_batch_size
        c.train_micro_batch_size_per_gpu = sizes.train_micro_batch_size_per_gpu
        c.gradient_accumulation_steps = sizes.gradient_accumulation_steps
        self._config_dict = None

    def is_gradient_accumulation_boundary(self) -> bool:
        """True when the coming ``step()`` ends an accumulation window (or what the script set)."""
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Let the script decide where windows end (DeepSpeed's hook for variable accumulation)."""
        self._boundary_override = is_boundary

    @property
    def config(self) -> dict[str, Any]:
        """The config as a dict, as DeepSpeed's ``engine.config`` (the Trainer reads
        ``engine.config.get("zero_optimization")``): every key, with ds's resolved values. Read-only use;
        ``ds_config`` is the typed config."""
        if self._config_dict is None:
            self._config_dict = self.ds_config.model_dump(mode="json", by_alias=True)
        return self._config_dict

    def get_global_grad_norm(self) -> float | None:
        """The unscaled global gradient norm of the last applied step (None before the first).

        None at fp32 ZeRO stage 0, as in DeepSpeed: there its optimizer is the bare torch optimizer, which
        keeps no norm (the Trainer then logs no ``grad_norm``; clipping still happens).
        """
        if self.ds_config.precision == "fp32" and self.ds_config.zero_optimization.stage == 0:
            return None
        return getattr(self.optimizer, "global_grad_norm", None)

    def was_step_applied(self) -> bool:
        """False when the last optimizer step was skipped (fp16 overflow)."""
        return self._step_applied

    @property
    def loss_scale(self) -> float:
        return self.parts.scaler.loss_scale if self.parts.scaler is not None else 1.0

    # ------------------------------------------------------------------ the loop
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.timers.time(FORWARD):
            return self.module(*args, **kwargs)

    def backward(
        self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True
    ) -> torch.Tensor:
        """Backward of ``loss / gradient_accumulation_steps`` (scaled for fp16); reduce at a boundary.

        Returns ``loss / gradient_accumulation_steps`` (``loss`` itself with ``scale_wrt_gas=False``), as
        DeepSpeed 0.19.8 does: the loss scaled for accumulation, never the fp16 loss scale.
        """
        self._require_optimizer("backward")
        gas = self.gradient_accumulation_steps() if scale_wrt_gas else 1
        scaled = loss.float() / gas if gas > 1 else loss
        sp = self.ds_config.sequence_parallel_size if self.ds_config.zero_optimization.stage < 3 else 1
        scaled = scaled * sp if sp > 1 else scaled  # DeepSpeed 0.19.8's Ulysses gradient: see _sequence.py
        # inside no_sync() the boundary backward keeps its gradients local, as DeepSpeed's does
        boundary = self.is_gradient_accumulation_boundary() and not self._inside_no_sync
        self._kept_local = self._inside_no_sync
        reducer = self.parts.reducer if self._reduce_this_step() else None
        if self.is_gradient_accumulation_boundary() and self.monitor.enabled:
            self.monitor.write_events([("Train/Samples/train_loss", loss.mean().item(), self.global_samples)])
        # gradients a script's own backward left in .grad are reduced with this one, unscaled (see _grad_guard)
        unscaled_ok = gas == 1 and sp == 1 and self.parts.scaler is None and not self.ds_config.amp.enabled
        with self.timers.time(BACKWARD), self._outside.engine_backward(adopt_earlier=unscaled_ok):
            if reducer is not None:
                reducer.set_boundary(boundary)
            if hasattr(self.optimizer, "set_boundary"):  # ZeRO stage 1 with overlap_comm reduces in backward
                self.optimizer.set_boundary(boundary)
            with self.timers.time(BACKWARD_INNER):
                if self.ds_config.amp.enabled:
                    ds_precision.amp_backward(scaled, self.optimizer)
                else:
                    self.optimizer.backward(scaled, retain_graph=retain_graph)
            if reducer is not None and boundary:
                with self.timers.time(BACKWARD_REDUCE):
                    reducer.reduce()
                    if self.parts.moe is not None:  # expert gradients: over the expert-data group (_moe)
                        self.parts.moe.reduce()
                    if hasattr(self.optimizer, "gradients_reduced"):
                        self.optimizer.gradients_reduced()
        return loss / gas if scale_wrt_gas else loss

    # DeepSpeed 0.19.8's torch-style backward: ``engine.scale(loss).backward()`` (or a direct
    # ``loss.backward()``) with the division by gradient accumulation and the reduction run by hooks around
    # autograd's pass (at ZeRO 1-3; ZeRO 0 refuses it). ds scales and reduces inside ``engine.backward``
    # only: step() refuses the gradients of such a backward (_grad_guard), and scale() names the feature.
    scale = missing_function(
        "deepspeed.runtime.engine.DeepSpeedEngine",
        "scale",
        "DeepSpeed's torch-style backward (engine.scale(loss).backward(), a direct loss.backward())",
        "Call engine.backward(loss): it scales the loss (fp16), backpropagates and reduces the gradients.",
    )

    def step(self) -> None:
        """One micro-step; at a boundary: optimizer step, LR step (unless skipped), counters, logging."""
        if self._inside_no_sync:
            raise NoSyncError("It is illegal to call Engine.step() inside no_sync context manager")
        self._require_optimizer("step")
        self._outside.check()
        if self._kept_local and self.is_gradient_accumulation_boundary():
            # DeepSpeed 0.19.8 steps on the unreduced gradients here at stage 0 (each rank its own update,
            # clipped by the mean of the ranks' norms) and fails with a KeyError at stage 1
            raise RuntimeError(
                "step() right after a backward inside no_sync(): the gradients were never reduced, so each "
                "rank would apply its own; run the boundary backward outside no_sync() (it reduces what "
                "accumulated), then step()"
            )
        boundary = self.is_gradient_accumulation_boundary()
        if boundary:
            with self.timers.time(STEP):
                if hasattr(self.optimizer, "grads_replicated"):
                    self.optimizer.grads_replicated = self._grads_replicated()
                applied = self.optimizer.step()
                applied = True if applied is None else bool(applied)  # apex optimizers return None
                if applied and self.lr_scheduler is not None:
                    self.lr_scheduler.step()
                if not applied:
                    self.skipped_steps += 1
                self._step_applied = applied
                self.zero_grad()
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self._write_step_events()
        self.timers.end_micro_step(boundary)
        if boundary:
            self._report()
        self.micro_steps += 1

    def get_wall_clock_timers(self) -> dict[str, float]:
        """With ``wall_clock_breakdown``: milliseconds per timer as of the last ``step()`` (DeepSpeed's names:
        ``fwd``/``bwd``/``bwd_inner``/``bwd_allreduce``/``step`` since the last accumulation boundary, each
        with ``_microstep`` for that micro-step alone); ``{}`` without it."""
        return dict(self.timers.snapshot)

    def empty_partition_cache(self) -> None:
        """Free stage 3's gathered parameter copies not in use (DeepSpeed's name); nothing to free below stage 3."""
        release = getattr(self.optimizer, "empty_partition_cache", None)
        if release is not None:
            release()

    def zero_grad(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad()
            self._outside.clear()

    def _require_optimizer(self, what: str) -> None:
        if self.parts.evaluation_only:
            raise NoOptimizerError(f"must provide optimizer during init in order to use {what}")

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside this context keeps its gradients local; the next boundary backward outside it
        reduces what accumulated. As DeepSpeed 0.19.8: stages 0 and 1 only (stages 2 and 3 partition the
        gradients in every backward, so there is nothing to defer), no ``step()`` inside, no nesting; its
        refusals are AssertionErrors, as DeepSpeed's."""
        if self.zero_optimization_stage() >= 2:
            raise NoSyncError(
                "no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage "
                f"{self.zero_optimization_stage()}"
            )
        if self._inside_no_sync:
            raise NoSyncError("no_sync context manager reentry is unsupported")
        self._inside_no_sync = True
        try:
            yield
        finally:
            self._inside_no_sync = False

    def _grads_replicated(self) -> bool:
        """Does every rank hold the same gradients at this step?

        True on one rank, and at stage 0 while the all-reduce runs. Otherwise (OneBitAdam's compression
        stage skips the all-reduce) ranks hold different gradients, so the precision wrapper must compute
        the norm and the overflow test across ranks.
        """
        if self.world_size == 1:
            return True
        return self.parts.reducer is not None and self._reduce_this_step()

    def _reduce_this_step(self) -> bool:
        """Stage 0 averages gradients, except while OneBitAdam compresses its momentum instead."""
        return getattr(self.basic_optimizer, "needs_gradient_allreduce", True)

    # ------------------------------------------------------------------ logging
    def _write_step_events(self) -> None:
        """DeepSpeed's monitor events after each optimizer step: lr, and the loss scale under fp16."""
        if not self.monitor.enabled:
            return
        events = [("Train/Samples/lr", self.get_lr()[0], self.global_samples)]
        if self.fp16_enabled():
            events.append(("Train/Samples/loss_scale", self.loss_scale, self.global_samples))
        self.monitor.write_events(events)

    def _report(self) -> None:
        if self.topology.rank != 0 or self.global_steps % self.ds_config.steps_per_print != 0:
            return
        lr, mom = self.get_lr(), self.get_mom()
        logger.info("step=%d, skipped=%d, lr=%s, mom=%s", self.global_steps, self.skipped_steps, lr, mom)
        if self.timers.enabled:
            logger.info(self.timers.report())

    def dump_state(self) -> None:
        """Print every engine attribute, sorted, in DeepSpeed's format, then the effective config."""
        print("DeepSpeedEngine:")
        for name in sorted(vars(self)):
            if not name.startswith("_"):
                print(f"  {name} {'.' * (29 - len(name))} {getattr(self, name)!r:.200}")
        print("DeepSpeedEngine configuration:")
        print(self.ds_config.model_dump_json(indent=2, exclude_defaults=True))

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(
        self,
        save_dir: str | Path,
        tag: Any = None,
        client_state: dict | None = None,
        save_latest: bool = True,
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        """Save on every rank: weights (rank 0), this rank's optimizer shard, schedule, counters, client state.

        ``exclude_frozen_parameters`` (DeepSpeed's): leave parameters with ``requires_grad=False`` out of the
        saved weights (loading such a checkpoint then needs ``load_module_strict=False``)."""
        if not save_dir:  # None or "": DeepSpeed 0.19.8 refuses both with this ValueError
            raise ValueError(f"save_dir must be a non-empty string, got {save_dir!r}")
        tp_group = self._tensor_parallel_group("save_checkpoint")
        experts = self._moe_checkpoint_names(tp_group, "save_checkpoint")
        tag = str(tag) if tag is not None else f"global_step{self.global_steps}"
        model_state = self._module_state_dict()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            model_state = {k: v for k, v in model_state.items() if k not in frozen}
        shard, model_files = self._sharded_state(), None
        if tp_group is not None and shard is not None:
            # AutoTP: the state of the whole parameters (what the unsplit model saves), so that it loads at
            # any tensor-parallel degree; every rank of the world takes part and writes into one checkpoint
            shard = logical_optimizer_state(
                shard, self.module, tp_group, self.parts.dp_group, self.zero_optimization_stage() > 0
            )
        if experts is not None:  # each expert in a file of its own, under its global index
            model_state, model_files = experts.model_files(model_state)
            if shard is not None:
                shard = experts.optimizer_shard(shard, self.parts.dp_group)
        ds_checkpoint.save_state(
            save_dir,
            tag,
            model_state=model_state,
            model_files=model_files,
            optimizer_shard=shard,
            lr_scheduler=self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            counters=self._counters(),
            client_state=client_state or {},
            config=self.ds_config.model_dump(mode="json"),
            save_latest=save_latest,
            tag_validation=self.ds_config.checkpoint.tag_validation,
            group=None if tp_group is not None else self.parts.dp_group,
        )
        return True

    def _expert_names(self) -> ExpertNames | None:
        """The renaming of the MoE layers' experts between this rank's and the checkpoint's (global) index."""
        return ExpertNames(self.module) if self.parts.moe is not None else None

    def _moe_checkpoint_names(self, tp_group: Any, what: str) -> ExpertNames | None:
        experts = self._expert_names()
        if experts is not None and tp_group is not None:
            raise FeatureNotAvailableError(
                f"{what} of a model with MoE layers split by AutoTP (tensor_parallel.autotp_size > 1) is not "
                "available in ds (a checkpoint of either alone is)"
            )
        return experts

    def load_checkpoint(
        self,
        load_dir: str | Path,
        tag: Any = None,
        load_module_strict: bool = True,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_only: bool = False,
    ) -> tuple[str | None, dict | None]:
        """Load a checkpoint saved at any world size; returns ``(path, client_state)`` or ``(None, None)``."""
        tp_group = self._tensor_parallel_group("load_checkpoint")
        experts = self._moe_checkpoint_names(tp_group, "load_checkpoint")
        state = ds_checkpoint.load_state(
            load_dir, None if tag is None else str(tag), load_model=experts is None
        )
        if state is None:
            return None, None
        if experts is not None:  # the dense weights and this rank's experts, under their local names
            state.model_state = experts.model_state(state)
        # stage 3 keeps only partitions: its optimizer loads the full weights (masters included)
        load_module = getattr(self.optimizer, "load_module_state_dict", None)
        if tp_group is not None:  # the checkpoint holds whole weights: this rank loads its shards of them
            load_module = functools.partial(ds_tpsp.tensor.load_full_state_dict, self.module, group=tp_group)
        (load_module or self.module.load_state_dict)(state.model_state, strict=load_module_strict)
        if not load_module_only:
            sharded = self._sharded_state()
            if sharded is not None:
                if load_optimizer_states and state.optimizer_groups:
                    _, mine = sharded
                    if tp_group is not None:  # each whole parameter's state cut to this rank's shard
                        shard = local_optimizer_state(state, mine, self.module, tp_group)
                    elif experts is not None:  # by name: the saved expert-parallel degree may differ
                        shard = experts.load_optimizer_shard(state, mine)
                    else:
                        ranges = [tuple(g["shard"]) for g in mine["groups"]]
                        shard = state.optimizer_shard(ranges, mine["rank"], mine["world_size"])
                    self.optimizer.load_sharded_state_dict(*shard)
                    zero = self.ds_config.zero_optimization
                    if zero.stage > 0 and not zero.load_from_fp32_weights:
                        # DeepSpeed's load_from_fp32_weights=false (a ZeRO key): keep the loaded optimizer
                        # state (moments, step) but rebuild the fp32 master from the weights just loaded
                        if load_module is not None:  # stage 3 sets its masters from the full weights
                            load_module(state.model_state, strict=load_module_strict)
                        else:
                            self._refresh_master_from_weights()
                elif load_module is None:
                    self._refresh_master_from_weights()
            if load_lr_scheduler_states and self.lr_scheduler is not None and state.lr_scheduler is not None:
                self.lr_scheduler.load_state_dict(state.lr_scheduler)
            self._load_counters(state.counters)
            state.restore_rng(self.topology.rank % max(1, state.world_size))
        return str(state.path), state.client_state

    def _module_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights; stage 3 gathers them from the partitions, AutoTP from the shards (collective)."""
        gathered = getattr(self.optimizer, "module_state_dict", None)
        if gathered is not None:
            return gathered()
        return ds_tpsp.tensor.full_state_dict(self.module, ds_tpsp.tensor.tp_group_of(self.module))

    def _tensor_parallel_group(self, what: str) -> Any:
        """The AutoTP group the module is split over (None: not split); refused at ZeRO stage 3, whose
        gathered weights would still be this rank's shards."""
        group = ds_tpsp.tensor.tp_group_of(self.module)
        if group is not None and self.zero_optimization_stage() == 3:
            raise FeatureNotAvailableError(
                f"{what} with tensor_parallel.autotp_size > 1 at ZeRO stage 3 is not available in ds (AutoTP "
                "checkpoints are written at ZeRO stages 0-2); train at stage 1 or 2, or save the weights with "
                "engine.save_16bit_model(dir)"
            )
        return group

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False) -> dict:
        """DeepSpeed's ZeRO-3 full state dict (what Accelerate's ``get_state_dict`` and the Trainer's
        ``save_model`` call): a collective on every rank; rank 0 gets the weights in their training dtype,
        the other ranks an empty dict."""
        if self.zero_optimization_stage() != 3:
            raise ValueError("_zero3_consolidated_16bit_state_dict requires ZeRO stage 3")
        state = self._module_state_dict()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        if self.global_rank != 0:
            return {}
        copies: dict[
            int, torch.Tensor
        ] = {}  # tied names keep sharing one tensor (save_pretrained drops the tie)
        for v in state.values():
            if id(v) not in copies:
                copies[id(v)] = v.detach().cpu().clone()
        return {k: copies[id(v)] for k, v in state.items()}

    def _consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False) -> dict:
        """DeepSpeed's whole-weights state dict of a partitioned model (what Accelerate's ``get_state_dict``
        calls under ZeRO-3 or AutoTP): a collective; rank 0 gets the weights, the other ranks an empty dict."""
        if self.zero_optimization_stage() == 3:
            return self._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters)
        if ds_tpsp.tensor.tp_group_of(self.module) is None:
            raise ValueError(
                "consolidated_16bit_state_dict is only applicable to cases where weights are partitioned, "
                "including Zero Stage 3 and tensor parallelism."
            )
        state = self._module_state_dict()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        return {k: v.detach().cpu().clone() for k, v in state.items()} if self.global_rank == 0 else {}

    def module_state_dict(self, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> dict:
        return self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)

    def load_module_state_dict(self, state_dict: dict, strict: bool = True, **_ignored: Any) -> None:
        self.module.load_state_dict(state_dict, strict=strict)

    def save_16bit_model(
        self,
        save_dir: str | Path,
        save_filename: str = "pytorch_model.bin",
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        """Rank 0 writes the module's weights (in their training dtype) to ``save_dir/save_filename``.

        A ``.safetensors`` name is written pickle-free; any other name with ``torch.save``, which is what
        DeepSpeed writes and what ``from_pretrained``-style loaders read.
        """
        gathered = getattr(self.optimizer, "gathered_16bit_state_dict", None)
        if gathered is not None:  # stage 3: collective; None unless stage3_gather_16bit_weights_on_model_save
            state = gathered()
            if state is None:
                if self.global_rank == 0:
                    logger.warning(
                        "save_16bit_model at ZeRO stage 3 saved nothing: set "
                        "zero_optimization.stage3_gather_16bit_weights_on_model_save to true"
                    )
                return False
        else:  # the whole weights (AutoTP: gathered from the shards, a collective)
            state = self._module_state_dict()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        experts = self._expert_names()
        if experts is not None:  # every expert under its global index (a collective at ep > 1)
            state = experts.whole_state(state, self.parts.dp_group)
        if self.global_rank == 0:
            _write_weights(Path(save_dir) / save_filename, state)
        return True

    save_fp16_model = save_16bit_model

    def deepspeed_io(
        self,
        dataset: Any,
        batch_size: int | None = None,
        route: str = "train",
        pin_memory: bool = True,
        data_sampler: Any = None,
        collate_fn: Any = None,
        num_local_io_workers: int | None = None,
    ) -> Any:
        """A loader of this rank's micro-batches of ``dataset`` (what ``initialize(training_data=...)`` builds)."""
        if data_sampler is not None or num_local_io_workers:
            raise ValueError(
                "deepspeed_io(data_sampler=..., num_local_io_workers=...) is not supported by ds; build a "
                "torch DataLoader yourself for a custom sampler"
            )
        return build_dataloader(
            dataset,
            micro_batch_size=batch_size or self.train_micro_batch_size_per_gpu(),
            rank=self.dp_rank,
            world_size=self.world_size,
            collate_fn=collate_fn,
            drop_last=self.ds_config.dataloader_drop_last,
        )

    def destroy(self) -> None:
        """Release what the engine holds (monitor files); DeepSpeed's teardown hook."""
        self.monitor.close()
        self._outside.remove()

    def __getattr__(self, name: str) -> Any:
        # nn.Module keeps parameters, buffers and submodules out of __dict__; look there first, then on the
        # wrapped module (DeepSpeed forwards unknown attributes the same way).
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")
            if module is not None and name != "module" and hasattr(module, name):
                return getattr(module, name)
            raise

    def _sharded_state(self) -> tuple[dict, dict] | None:
        fn = getattr(self.optimizer, "sharded_state_dict", None)
        return fn() if fn is not None else None

    def _refresh_master_from_weights(self) -> None:
        """The fp32 masters restart from the loaded (possibly low-precision) weights; other state is kept."""
        tensors, meta = self._sharded_state()
        for g, group in enumerate(meta["groups"]):
            start, end = group["shard"]
            flat = torch.cat([p.detach().reshape(-1).float() for p in _group_params(self.module, group)])
            tensors[f"g{g}.master"] = flat[start:end].clone()
        self.optimizer.load_sharded_state_dict(tensors, meta)

    def _counters(self) -> dict[str, int]:
        return {
            "global_steps": self.global_steps,
            "global_samples": self.global_samples,
            "skipped_steps": self.skipped_steps,
            "micro_steps": self.micro_steps,
            "dp_world_size": self.world_size,
        }

    def _load_counters(self, counters: dict[str, Any]) -> None:
        self.global_steps = int(counters.get("global_steps", 0))
        self.global_samples = int(counters.get("global_samples", self.global_steps * self.train_batch_size()))
        self.skipped_steps = int(counters.get("skipped_steps", 0))
        self.micro_steps = self.global_steps * self.gradient_accumulation_steps()


def _group_params(module: nn.Module, group_meta: dict) -> list[torch.Tensor]:
    named = dict(module.named_parameters())
    return [named[p["name"]] for p in group_meta["params"]]


def _write_weights(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Write under a temporary name and rename, so a crash never leaves a half-written weights file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".safetensors":
        import safetensors.torch

        # safetensors refuses tensors that share storage (tied weights): give each its own copy
        safetensors.torch.save_file({k: v.detach().cpu().clone().contiguous() for k, v in state.items()}, tmp)
    else:
        torch.save({k: v.detach().cpu() for k, v in state.items()}, tmp)
    os.replace(tmp, path)
