"""DeepSpeed's ``PipelineEngine``: ``train_batch`` runs the 1F1B schedule of ds_pipe on this rank's stage;
scaling, data-parallel reduction and the optimizer step are the engine's, as for any model."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import ds_launch
import ds_pipe
import ds_precision
import torch
from ds_config import DSConfig
from ds_launch import Topology

from ds_engine._assemble import Parts
from ds_engine._data import RepeatingLoader
from ds_engine._engine import DeepSpeedEngine
from ds_engine._pipe_checkpoint import load_pipeline_checkpoint, save_pipeline_checkpoint
from ds_engine._pipe_setup import collective_timeout
from ds_engine._timers import BACKWARD, BACKWARD_INNER, BACKWARD_REDUCE

__all__ = ["PipelineEngine"]


class _Hooks:
    """What the runner asks of the engine at each instruction (ds_pipe.StageHooks)."""

    def __init__(self, engine: PipelineEngine) -> None:
        self.engine = engine

    def backward(self, outputs: Any, grads: list[torch.Tensor] | None, last_micro_batch: bool) -> None:
        e = self.engine
        opt = e.optimizer
        reducer = e.parts.reducer if e._reduce_this_step() else None
        gas = e.gradient_accumulation_steps()
        with e.timers.time(BACKWARD), e._outside.engine_backward(adopt_earlier=False):
            if reducer is not None:
                reducer.set_boundary(last_micro_batch)
            if hasattr(opt, "set_boundary"):
                opt.set_boundary(last_micro_batch)
            with e.timers.time(BACKWARD_INNER):
                if grads is None:  # the last stage: the micro-batch's loss, scaled like engine.backward's
                    scaled = outputs.float() / gas if gas > 1 else outputs
                    if e.ds_config.amp.enabled:
                        ds_precision.amp_backward(scaled, opt)
                    else:
                        opt.backward(scaled)
                else:  # the gradients the next stage sent back (already loss-scaled there)
                    torch.autograd.backward(outputs, grads)
                    if hasattr(opt, "micro_step_done"):
                        opt.micro_step_done()

    def reduce_tied_grads(self) -> None:
        self.engine.module.allreduce_tied_weight_gradients()

    def reduce_grads(self) -> None:
        e = self.engine
        reducer = e.parts.reducer if e._reduce_this_step() else None
        if reducer is not None:
            with e.timers.time(BACKWARD_REDUCE):
                reducer.reduce()
                if hasattr(e.optimizer, "gradients_reduced"):
                    e.optimizer.gradients_reduced()

    def step(self) -> None:
        e = self.engine
        gas = e.gradient_accumulation_steps()
        try:  # the engine's micro-step accounting, the last one a boundary
            for i in range(gas):
                e._boundary_override = i == gas - 1
                DeepSpeedEngine.step(e)
        finally:
            e._boundary_override = None


class PipelineEngine(DeepSpeedEngine):
    """The engine of a ``PipelineModule``: ``train_batch`` / ``eval_batch`` instead of forward, backward
    and step. ``engine.grid`` is the pipeline's grid (DeepSpeed's ``PipelineParallelGrid`` names)."""

    def __init__(
        self,
        parts: Parts,
        config: DSConfig,
        topology: Topology,
        training_dataloader: Any,
        grid: ds_pipe.PipelineGrid,
    ) -> None:
        super().__init__(parts, config, topology, training_dataloader)
        self.grid = grid
        self.num_stages = grid.pipe_parallel_size
        self.stage_id = grid.stage_id
        self.prev_stage = self.stage_id - 1
        self.next_stage = self.stage_id + 1
        self.micro_batch_size = self.train_micro_batch_size_per_gpu()
        self.micro_batches = self.gradient_accumulation_steps()
        self.is_pipe_parallel = self.num_stages > 1
        self.is_data_parallel = grid.data_parallel_size > 1
        self.is_model_parallel = grid.model_parallel_size > 1
        # ds-launch's reports name the stage beside the rank (a failure, a stall)
        ds_launch.set_rank_role(
            f"pipeline stage {self.stage_id} of {self.num_stages}"
            + (f", data-parallel rank {grid.data_parallel_id}" if self.is_data_parallel else "")
        )
        if config.pipeline.activation_checkpoint_interval > 0:  # the config seeds the module, as in DeepSpeed
            parts.model.set_checkpoint_interval(config.pipeline.activation_checkpoint_interval)
        # a neighbour that hangs is an error naming its stage after the job's collective timeout
        self.runner = ds_pipe.PipelineRunner(parts.model, grid, topology.device, timeout=collective_timeout())
        self._hooks = _Hooks(self)
        self.data_iterator: Iterator | None = None
        self._train_batch_s = 0.0  # train_batch's time since the last steps_per_print line
        self.batch_fn: Any = None
        self.agg_train_loss: torch.Tensor | None = None
        self.agg_eval_loss: Any = None
        if training_dataloader is not None:
            self.set_dataiterator(iter(RepeatingLoader(training_dataloader)))

    # ------------------------------------------------------------------ DeepSpeed's pipeline API
    def train_batch(self, data_iter: Iterator | None = None) -> torch.Tensor:
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches read from ``data_iter`` (on the
        first and the last stage); returns the mean loss, averaged over data-parallel ranks, on every stage."""
        if not torch.is_grad_enabled():
            raise RuntimeError("train_batch() requires gradients enabled. Use eval_batch() instead.")
        self._require_optimizer("train_batch")
        if data_iter is not None:
            self.set_dataiterator(data_iter)
        start = time.perf_counter()
        loss = self.runner.train_batch(self._batches(), self.gradient_accumulation_steps(), self._hooks)
        self._train_batch_s += time.perf_counter() - start
        self.agg_train_loss = loss
        every = self.ds_config.steps_per_print
        if every and self.global_steps % every == 0:  # DeepSpeed's line, on the first rank: the loss returned
            iter_time, self._train_batch_s = self._train_batch_s / every, 0.0
            if self.topology.rank == 0:
                print(
                    f"steps: {self.global_steps} loss: {loss:0.4f} iter time (s): {iter_time:0.3f} "
                    f"samples/sec: {self.train_batch_size() / max(iter_time, 1e-9):0.3f}"
                )
        if self.monitor.enabled and self.topology.rank == 0:
            self.monitor.write_events([("Train/Samples/train_loss", loss.item(), self.global_samples)])
        return loss

    def eval_batch(
        self,
        data_iter: Iterator,
        return_logits: bool = False,
        compute_loss: bool = True,
        reduce_output: str | None = "avg",
        bcast_loss: bool = True,
        num_micro_batches: int | None = None,
    ) -> Any:
        """Forwards only over ``num_micro_batches`` (default: gradient_accumulation_steps) micro-batches."""
        self.set_dataiterator(data_iter)
        result = self.runner.eval_batch(
            self._batches(),
            num_micro_batches or self.gradient_accumulation_steps(),
            compute_loss=compute_loss,
            reduce_output=reduce_output,
            bcast_loss=bcast_loss,
            return_logits=return_logits,
        )
        self.agg_eval_loss = result[0] if return_logits else result
        return result

    def set_dataiterator(self, iterator: Iterator) -> None:
        """The iterator train_batch reads when given none (read on the first and the last stage only)."""
        if self.is_first_stage() or self.is_last_stage():
            self.data_iterator = iterator

    def set_batch_fn(self, fn: Any) -> None:
        """``fn(batch)`` is what the first and the last stage use of each batch the data iterator yields."""
        self.batch_fn = fn

    def _batches(self) -> Iterator | None:
        if self.batch_fn is None or self.data_iterator is None:
            return self.data_iterator
        return map(self.batch_fn, self.data_iterator)

    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    def reset_activation_shape(self) -> None:
        """Shapes travel with every message in ds; nothing to reset."""

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(
        self,
        save_dir: Any,
        tag: Any = None,
        client_state: dict | None = None,
        save_latest: bool = True,
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        """Per-layer weight files and per-stage training state (``_pipe_checkpoint``); every rank calls it."""
        if not save_dir:
            raise ValueError(f"save_dir must be a non-empty string, got {save_dir!r}")
        tag = str(tag) if tag is not None else f"global_step{self.global_steps}"
        save_pipeline_checkpoint(self, save_dir, tag, client_state or {})
        return True

    def load_checkpoint(
        self,
        load_dir: Any,
        tag: Any = None,
        load_module_strict: bool = True,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_only: bool = False,
    ) -> tuple[str | None, dict | None]:
        """Weights at any pipeline degree; optimizer state at the degree saved (else an error saying so)."""
        return load_pipeline_checkpoint(
            self,
            load_dir,
            None if tag is None else str(tag),
            strict=load_module_strict,
            load_optimizer_states=load_optimizer_states,
            load_lr_scheduler_states=load_lr_scheduler_states,
            load_module_only=load_module_only,
        )

    # ------------------------------------------------------------------ what a pipeline refuses
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise ds_pipe.PipelineError("Only train_batch() is accessible in pipeline mode.")

    def backward(self, *args: Any, **kwargs: Any) -> Any:
        raise ds_pipe.PipelineError("Only train_batch() is accessible in pipeline mode.")

    def step(self, *args: Any, **kwargs: Any) -> None:
        raise ds_pipe.PipelineError("Only train_batch() is accessible in pipeline mode.")
