"""Runs DeepSpeed's schedules on one stage: loads micro-batches, runs forward and backward, exchanges
activations and gradients with the neighbouring stages, and leaves reduction and the optimizer step to the
engine's hooks (``StageHooks``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ds_pipe import schedule as S
from ds_pipe._grid import PipelineGrid
from ds_pipe._module import PipelineError, PipelineModule
from ds_pipe._p2p import PeerFailed, recv_tensors, send_failure, send_tensors

__all__ = ["PipelineRunner", "StageHooks"]


class StageHooks(Protocol):
    """What the engine does for the runner (scaling, reduction and stepping are the engine's)."""

    def backward(self, outputs: Any, grads: list[torch.Tensor] | None, last_micro_batch: bool) -> None:
        """``grads is None``: ``outputs`` is the micro-batch's loss (last stage); else backpropagate
        ``grads`` into ``outputs``."""

    def reduce_tied_grads(self) -> None: ...

    def reduce_grads(self) -> None: ...

    def step(self) -> None: ...


def _is_transport_error(exc: RuntimeError) -> bool:
    """gloo's (and NCCL's) errors when the peer's process is gone or its connection broke."""
    text = str(exc)
    return any(m in text for m in ("Connection closed", "Connection reset", "gloo", "NCCL", "Broken pipe"))


def _is_timeout(exc: BaseException) -> bool:
    """The backend gave up waiting: gloo's "Timed out waiting 3000ms for recv operation", NCCL's watchdog."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("timed out" in text or "timeout" in text)


def _as_tuple(x: Any) -> tuple[torch.Tensor, ...]:
    if torch.is_tensor(x):
        return (x,)
    if isinstance(x, (tuple, list)) and all(torch.is_tensor(t) for t in x):
        return tuple(x)
    raise PipelineError(
        f"a pipeline stage must output a tensor or a tuple of tensors, got {type(x).__name__}"
    )


def _to(x: Any, device: torch.device) -> Any:
    if torch.is_tensor(x):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(t, device) for t in x)
    return x


class PipelineRunner:
    """Executes schedules for ``module``'s stage. ``trace`` (a list) receives ``(instruction, start, end)``
    in ``time.perf_counter`` seconds for every instruction, for the bubble benchmark.

    ``timeout`` bounds every wait on a neighbouring stage (None: the pipe group's own timeout): a neighbour
    that hangs, alive but stuck, is then an error naming its stage and rank, as one that fails or dies is.
    """

    def __init__(
        self,
        module: PipelineModule,
        grid: PipelineGrid,
        device: torch.device,
        timeout: timedelta | None = None,
    ) -> None:
        self.module = module
        self.timeout = timeout
        self.grid = grid
        self.device = device
        self.stage_id = grid.stage_id
        self.num_stages = grid.pipe_parallel_size
        self.prev_rank = grid.pp_group[self.stage_id - 1] if self.stage_id > 0 else None
        self.next_rank = grid.pp_group[self.stage_id + 1] if self.stage_id < self.num_stages - 1 else None
        self.trace: list[tuple[str, float, float]] | None = None
        self._handlers = {
            S.LoadMicroBatch: self._load,
            S.ForwardPass: self._forward,
            S.BackwardPass: self._backward,
            S.SendActivation: self._send_activation,
            S.RecvActivation: self._recv_activation,
            S.SendGrad: self._send_grad,
            S.RecvGrad: self._recv_grad,
            S.ReduceTiedGrads: lambda _: self._hooks.reduce_tied_grads(),
            S.ReduceGrads: lambda _: self._hooks.reduce_grads(),
            S.OptimizerStep: lambda _: self._hooks.step(),
        }

    @property
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    # ------------------------------------------------------------------ batches
    def train_batch(self, data_iter: Iterator | None, micro_batches: int, hooks: StageHooks) -> torch.Tensor:
        """One batch of 1F1B; returns the mean micro-batch loss averaged over data-parallel ranks, on every stage."""
        self._start(data_iter, micro_batches, hooks, train=True)
        self._run(S.TrainSchedule(micro_batches, self.num_stages, self.stage_id))
        return self._aggregate(self._losses, "avg", broadcast=True)

    def eval_batch(
        self,
        data_iter: Iterator | None,
        micro_batches: int,
        *,
        compute_loss: bool = True,
        reduce_output: str | None = "avg",
        bcast_loss: bool = True,
        return_logits: bool = False,
    ) -> Any:
        """Forwards only (DeepSpeed's InferenceSchedule); the loss as ``train_batch`` returns it."""
        self._start(data_iter, micro_batches, None, train=False, compute_loss=compute_loss)
        with torch.no_grad():
            self._run(S.InferenceSchedule(micro_batches, self.num_stages, self.stage_id))
            losses = self._losses if compute_loss else self._logits
            result = (
                self._aggregate(losses, reduce_output, broadcast=bcast_loss)
                if losses or not self.is_last_stage
                else None
            )
        if return_logits:
            return result, (self._logits if self.is_last_stage else None)
        return result

    def _start(
        self, data_iter: Any, micro_batches: int, hooks: Any, *, train: bool, compute_loss: bool = True
    ) -> None:
        if data_iter is None and (self.is_first_stage or self.is_last_stage):
            raise PipelineError(
                f"stage {self.stage_id} reads the data but no data iterator was given: pass one to "
                "train_batch()/eval_batch(), call set_dataiterator(), or give initialize() training_data"
            )
        self._data_iter = data_iter
        self._micro_batches = micro_batches
        self._hooks = hooks
        self._train = train
        self._compute_loss = compute_loss
        self._buffers: dict[int, dict[str, Any]] = {}
        self._losses: list[torch.Tensor] = []
        self._logits: list[Any] = []
        self._loaded = 0
        self._backwards = 0
        self._sent_meta: tuple | None = None
        self.module.train(train)

    def _run(self, schedule: S.PipeSchedule) -> None:
        try:
            for step in schedule:
                for cmd in step:
                    t0 = time.perf_counter()
                    try:
                        self._handlers[type(cmd)](cmd)
                    except (PeerFailed, RuntimeError) as exc:
                        error = self._explain(cmd, exc, time.perf_counter() - t0)
                        if error is None:
                            raise
                        raise error from None
                    if self.trace is not None:
                        self.trace.append((cmd.name, t0, time.perf_counter()))
        except BaseException:
            self._tell_neighbours()
            raise

    def _explain(self, cmd: Any, exc: BaseException, waited_s: float) -> PipelineError | None:
        """What a failed instruction says about the other stages: the neighbour it talks to failed, died or
        hangs, or a collective of the instruction timed out; None when the error is this stage's own."""
        peer = self._peer_of(cmd)
        first_line = (
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}" if str(exc) else type(exc).__name__
        )
        if peer is not None:
            who = f"stage {peer} (rank {self.grid.pp_group[peer]})"
            if _is_timeout(exc):
                return PipelineError(
                    f"stage {self.stage_id}: {who} did not answer for {waited_s:.0f} s during {cmd.name} "
                    f"({first_line}): it hangs (alive but stuck, in its own work or in a collective the others "
                    "are not in), or it is slower than the timeout (deepspeed.init_distributed(timeout=...))"
                )
            if isinstance(exc, PeerFailed) or _is_transport_error(exc):
                return PipelineError(
                    f"stage {self.stage_id}: {who} failed or died during {cmd.name} ({first_line}); its own "
                    "error says why"
                )
            return None
        if _is_timeout(exc):
            over = {
                "ReduceGrads": f"the ranks holding stage {self.stage_id} (data-parallel ranks {self.grid.dp_group})",
                "ReduceTiedGrads": "the stages holding a tied weight",
                "OptimizerStep": "every stage (the gradient norm and the overflow check span the pipeline)",
            }.get(cmd.name, "other ranks")
            return PipelineError(
                f"stage {self.stage_id} (rank {self.grid.global_rank}): {cmd.name} waited {waited_s:.0f} s in a "
                f"collective over {over} and timed out ({first_line}): one of them hangs or failed"
            )
        return None

    def _peer_of(self, cmd: Any) -> int | None:
        """The stage a point-to-point instruction talks to."""
        if isinstance(cmd, (S.SendActivation, S.RecvGrad)):
            return self.stage_id + 1
        if isinstance(cmd, (S.RecvActivation, S.SendGrad)):
            return self.stage_id - 1
        return None

    def _tell_neighbours(self) -> None:
        for rank in (self.prev_rank, self.next_rank):
            if rank is not None:
                send_failure(rank, self.grid.pp_proc_group)

    # ------------------------------------------------------------------ instructions
    def _buf(self, cmd: Any) -> dict[str, Any]:
        return self._buffers.setdefault(cmd.buffer_id, {})

    def _load(self, cmd: Any) -> None:
        try:
            batch = next(self._data_iter)
        except StopIteration:
            raise PipelineError(
                f"stage {self.stage_id}: the data iterator ended after {self._loaded} of {self._micro_batches} "
                "micro-batches of this batch (each batch reads gradient_accumulation_steps micro-batches on "
                "the first and the last stage): give a longer iterator, or wrap the loader in "
                "deepspeed.utils.RepeatingLoader"
            ) from None
        self._loaded += 1
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise PipelineError(
                f"stage {self.stage_id}: each micro-batch from the data iterator must be (inputs, labels), got "
                f"{type(batch).__name__}" + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else "")
            )
        buf = self._buf(cmd)
        if self.is_first_stage:
            buf["inputs"] = _to(batch[0], self.device)
        if self.is_last_stage:
            buf["labels"] = _to(batch[1], self.device)

    def _forward(self, cmd: Any) -> None:
        buf = self._buf(cmd)
        inputs = buf["inputs"]
        start, stop = self.module.layer_range()
        outputs = self.module(inputs)
        if self.is_last_stage:
            if not self._train:
                self._logits.append(outputs)
            if self._train or self._compute_loss:
                loss = (
                    self.module.loss_fn(outputs, buf["labels"])
                    if self.module.loss_fn is not None
                    else outputs
                )
                if not torch.is_tensor(loss):
                    raise PipelineError(
                        f"stage {self.stage_id}: the loss of {self.module.layer_name(stop - 1)} and loss_fn is a "
                        f"{type(loss).__name__}, not a tensor"
                    )
                self._losses.append(loss.detach())
                buf["outputs"] = loss
        else:
            out = _as_tuple(outputs)
            shapes = tuple((tuple(t.shape), t.dtype) for t in out)
            if self._sent_meta is None:
                self._sent_meta = shapes
            elif shapes != self._sent_meta and not self.module.dynamic_shape:
                raise PipelineError(
                    f"stage {self.stage_id}: the output of {self.module.layer_name(stop - 1)} changed between "
                    f"micro-batches of one batch, from {self._sent_meta} to {shapes}: give every micro-batch "
                    "the same shapes (pad them), or build the PipelineModule with dynamic_shape=True"
                )
            buf["outputs"] = outputs
        if not self._train:
            buf.pop("inputs", None)

    def _backward(self, cmd: Any) -> None:
        buf = self._buf(cmd)
        self._backwards += 1
        last = self._backwards == self._micro_batches
        if self.is_last_stage:
            self._hooks.backward(buf["outputs"], None, last)
        else:
            outs = [t for t in _as_tuple(buf["outputs"]) if t.is_floating_point()]
            pairs = [(o, g) for o, g in zip(outs, buf["grads"]) if o.requires_grad]
            self._hooks.backward([o for o, _ in pairs], [g for _, g in pairs], last)
        buf.pop("outputs", None)
        buf.pop("grads", None)

    def _send_activation(self, cmd: Any) -> None:
        send_tensors(
            _as_tuple(self._buf(cmd)["outputs"]), self.next_rank, self.grid.pp_proc_group, self.timeout
        )

    def _recv_activation(self, cmd: Any) -> None:
        tensors, _ = recv_tensors(self.prev_rank, self.grid.pp_proc_group, self.device, self.timeout)
        if self._train:
            tensors = tuple(t.requires_grad_() if t.is_floating_point() else t for t in tensors)
        self._buf(cmd)["inputs"] = tensors[0] if len(tensors) == 1 else tensors

    def _send_grad(self, cmd: Any) -> None:
        buf = self._buf(cmd)
        ins = [t for t in _as_tuple(buf.pop("inputs")) if t.is_floating_point()]
        grads = tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in ins)
        send_tensors(grads, self.prev_rank, self.grid.pp_proc_group, self.timeout)

    def _recv_grad(self, cmd: Any) -> None:
        grads, _ = recv_tensors(self.next_rank, self.grid.pp_proc_group, self.device, self.timeout)
        self._buf(cmd)["grads"] = list(grads)

    # ------------------------------------------------------------------ the loss every stage returns
    def _aggregate(self, losses: list[Any], reduce_output: str | None, *, broadcast: bool) -> Any:
        """The last stage's mean over micro-batches, averaged over its data-parallel group, broadcast over
        the pipeline (DeepSpeed returns it on every stage)."""
        if self.is_last_stage:
            if reduce_output is None:
                return losses
            if reduce_output != "avg":
                raise NotImplementedError(f"reduction type {reduce_output} not supported.")
            loss = torch.stack([torch.as_tensor(x).float().mean() for x in losses]).mean()
            if self.grid.data_parallel_size > 1:
                dist.all_reduce(loss, group=self.grid.dp_proc_group)
                loss /= self.grid.data_parallel_size
        else:
            loss = torch.zeros((), dtype=torch.float32, device=self.device)
        if broadcast and self.num_stages > 1:
            self._broadcast_loss(loss)
        return loss

    def _broadcast_loss(self, loss: torch.Tensor) -> None:
        """The last stage's loss to every stage, waiting at most ``timeout``; a timeout names the last stage."""
        src, t0 = self.grid.pp_group[-1], time.perf_counter()
        try:
            work = dist.broadcast(loss, src=src, group=self.grid.pp_proc_group, async_op=True)
            work.wait() if self.timeout is None else work.wait(self.timeout)
        except RuntimeError as exc:
            if not (_is_timeout(exc) or _is_transport_error(exc)):
                raise
            what = "timed out" if _is_timeout(exc) else "failed"
            raise PipelineError(
                f"stage {self.stage_id}: the loss broadcast from the last stage (stage {self.num_stages - 1}, rank "
                f"{src}) {what} after {time.perf_counter() - t0:.0f} s ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200]}): a stage of this pipeline hangs, failed or died"
            ) from None
