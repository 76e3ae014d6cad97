"""The engine: DeepSpeed's training-loop semantics over the parts ``assemble`` built."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import ds_checkpoint
import ds_precision
import torch
from ds_config import DSConfig
from ds_launch import Topology
from torch import nn

from ds_engine._assemble import Parts
from ds_engine._timers import BACKWARD, BACKWARD_INNER, BACKWARD_REDUCE, FORWARD, STEP, WallClockTimers

logger = logging.getLogger("ds_engine")


class DeepSpeedEngine(nn.Module):
    """Wraps the model; ``forward``, ``backward(loss)`` and ``step()`` follow DeepSpeed's semantics.

    Every ``step()`` call is one micro-step. The optimizer, the LR schedule and the counters act only at
    a gradient-accumulation boundary (every ``gradient_accumulation_steps`` micro-steps). A step skipped
    for fp16 overflow updates nothing, does not step the LR schedule, and counts in ``skipped_steps``
    (``global_steps`` still advances, as in DeepSpeed).
    """

    def __init__(
        self, parts: Parts, config: DSConfig, topology: Topology, training_dataloader: Any = None
    ) -> None:
        super().__init__()
        self.module = parts.model
        self.parts = parts
        self.config = config
        self.topology = topology
        self.optimizer = parts.optimizer
        self.basic_optimizer = parts.basic_optimizer
        self.lr_scheduler = parts.scheduler
        self.training_dataloader = training_dataloader
        self.micro_steps = 0
        self.global_steps = 0
        self.global_samples = 0
        self.skipped_steps = 0
        self.timers = WallClockTimers(config.wall_clock_breakdown, topology.device)
        if config.dump_state and topology.rank == 0:
            self.dump_state()

    # ------------------------------------------------------------------ sizes and counters
    def train_batch_size(self) -> int:
        return self.config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self.config.gradient_accumulation_steps

    @property
    def local_rank(self) -> int:
        return self.topology.local_rank

    @property
    def device(self) -> torch.device:
        return self.topology.device

    @property
    def world_size(self) -> int:
        return self.parts.dp_world_size

    def is_gradient_accumulation_boundary(self) -> bool:
        """True when the coming ``step()`` ends an accumulation window."""
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float | None:
        """The unscaled global gradient norm of the last applied step (None before the first)."""
        return getattr(self.optimizer, "global_grad_norm", None)

    @property
    def loss_scale(self) -> float:
        return self.parts.scaler.loss_scale if self.parts.scaler is not None else 1.0

    # ------------------------------------------------------------------ the loop
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.timers.time(FORWARD):
            return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
        """Backward of ``loss / gradient_accumulation_steps`` (scaled for fp16); reduce at a boundary."""
        gas = self.gradient_accumulation_steps()
        scaled = loss.float() / gas if gas > 1 else loss
        boundary = self.is_gradient_accumulation_boundary()
        reducer = self.parts.reducer if self._reduce_this_step() else None
        with self.timers.time(BACKWARD):
            if reducer is not None:
                reducer.set_boundary(boundary)
            if hasattr(self.optimizer, "set_boundary"):  # ZeRO stage 1 with overlap_comm reduces in backward
                self.optimizer.set_boundary(boundary)
            with self.timers.time(BACKWARD_INNER):
                if self.config.amp.enabled:
                    ds_precision.amp_backward(scaled, self.optimizer)
                else:
                    self.optimizer.backward(scaled, retain_graph=retain_graph)
            if reducer is not None and boundary:
                with self.timers.time(BACKWARD_REDUCE):
                    reducer.reduce()
                    if hasattr(self.optimizer, "gradients_reduced"):
                        self.optimizer.gradients_reduced()
        return loss

    def step(self) -> None:
        """One micro-step; at a boundary: optimizer step, LR step (unless skipped), counters, logging."""
        if self.is_gradient_accumulation_boundary():
            with self.timers.time(STEP):
                if hasattr(self.optimizer, "grads_replicated"):
                    self.optimizer.grads_replicated = self._grads_replicated()
                applied = self.optimizer.step()
                applied = True if applied is None else bool(applied)  # apex optimizers return None
                if applied and self.lr_scheduler is not None:
                    self.lr_scheduler.step()
                if not applied:
                    self.skipped_steps += 1
                self.optimizer.zero_grad()
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self._report()
        self.micro_steps += 1

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

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
    def _report(self) -> None:
        if self.topology.rank != 0 or self.global_steps % self.config.steps_per_print != 0:
            return
        lr = self.get_lr()
        mom = [g.get("momentum", g.get("betas")) for g in self.optimizer.param_groups]
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
        print(self.config.model_dump_json(indent=2, exclude_defaults=True))

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(
        self,
        save_dir: str | Path,
        tag: Any = None,
        client_state: dict | None = None,
        save_latest: bool = True,
    ) -> bool:
        """Save on every rank: weights (rank 0), this rank's optimizer shard, schedule, counters, client state."""
        tag = str(tag) if tag is not None else f"global_step{self.global_steps}"
        ds_checkpoint.save_state(
            save_dir,
            tag,
            model_state=self._module_state_dict(),
            optimizer_shard=self._sharded_state(),
            lr_scheduler=self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            counters=self._counters(),
            client_state=client_state or {},
            config=self.config.model_dump(mode="json"),
            save_latest=save_latest,
            tag_validation=self.config.checkpoint.tag_validation,
            group=self.parts.dp_group,
        )
        return True

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
        state = ds_checkpoint.load_state(load_dir, None if tag is None else str(tag))
        if state is None:
            return None, None
        # stage 3 keeps only partitions: its optimizer loads the full weights (masters included)
        load_module = getattr(self.optimizer, "load_module_state_dict", None)
        (load_module or self.module.load_state_dict)(state.model_state, strict=load_module_strict)
        if not load_module_only:
            sharded = self._sharded_state()
            if sharded is not None:
                if load_optimizer_states and state.optimizer_groups:
                    _, mine = sharded
                    ranges = [tuple(g["shard"]) for g in mine["groups"]]
                    self.optimizer.load_sharded_state_dict(
                        *state.optimizer_shard(ranges, mine["rank"], mine["world_size"])
                    )
                    zero = self.config.zero_optimization
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
        """The full weights; stage 3 gathers them from the partitions (collective)."""
        gathered = getattr(self.optimizer, "module_state_dict", None)
        return gathered() if gathered is not None else self.module.state_dict()

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
