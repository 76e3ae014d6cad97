"""DeepSpeed's pipeline schedules: generators of instruction lists, one list per step.

Each step is atomic: a barrier may sit between two steps without deadlock, because every send in a step
is matched by the neighbouring stage's receive in the same step. ``TrainSchedule`` is DeepSpeed's
synchronous 1F1B (forward and backward alternate once the pipeline is full, so at most
``stages - stage_id`` micro-batches are in flight on a stage); ``InferenceSchedule`` runs forwards only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

__all__ = [
    "BackwardPass",
    "BufferOpInstruction",
    "DataParallelSchedule",
    "ForwardPass",
    "InferenceSchedule",
    "LoadMicroBatch",
    "OptimizerStep",
    "PipeInstruction",
    "PipeSchedule",
    "RecvActivation",
    "RecvGrad",
    "ReduceGrads",
    "ReduceTiedGrads",
    "SendActivation",
    "SendGrad",
    "TrainSchedule",
]


class PipeInstruction:
    """One instruction of a schedule; keyword arguments become attributes (``buffer_id``)."""

    def __init__(self, **kwargs: Any) -> None:
        self.name = self.__class__.__name__
        self.kwargs = kwargs
        for key, val in kwargs.items():
            setattr(self, key, val)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.name}({args})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PipeInstruction) and (self.name, self.kwargs) == (other.name, other.kwargs)

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.kwargs.items()))))


class OptimizerStep(PipeInstruction):
    """Apply the accumulated gradients."""


class ReduceGrads(PipeInstruction):
    """Reduce the gradients over the stage's data-parallel group."""


class ReduceTiedGrads(PipeInstruction):
    """Sum tied weights' gradients over the stages that hold them."""


class BufferOpInstruction(PipeInstruction):
    """An instruction on one pipeline buffer."""

    def __init__(self, buffer_id: int, **kwargs: Any) -> None:
        super().__init__(buffer_id=buffer_id, **kwargs)


class LoadMicroBatch(BufferOpInstruction):
    """Read the next micro-batch from the data iterator (first stage: inputs; last stage: labels)."""


class ForwardPass(BufferOpInstruction):
    """Forward of the stage on a buffer."""


class BackwardPass(BufferOpInstruction):
    """Backward of the stage on a buffer."""


class SendActivation(BufferOpInstruction):
    """Send a buffer's outputs to the next stage."""


class RecvActivation(BufferOpInstruction):
    """Receive the previous stage's outputs into a buffer."""


class SendGrad(BufferOpInstruction):
    """Send the gradients of a buffer's inputs to the previous stage."""


class RecvGrad(BufferOpInstruction):
    """Receive the gradients of a buffer's outputs from the next stage."""


class PipeSchedule(ABC):
    """The instructions of one batch of ``micro_batches`` on stage ``stage_id`` of ``stages``."""

    def __init__(self, micro_batches: int, stages: int, stage_id: int) -> None:
        super().__init__()
        self.micro_batches = micro_batches
        self.stages = stages
        self.stage_id = stage_id
        self.prev_stage = stage_id - 1
        self.next_stage = stage_id + 1

    @abstractmethod
    def steps(self) -> Iterator[list[PipeInstruction]]:
        """Yield the instructions of each step."""

    def num_pipe_buffers(self) -> int:
        return self.micro_batches

    def _valid_micro_batch(self, micro_batch_id: int) -> bool:
        return 0 <= micro_batch_id < self.micro_batches

    def _valid_stage(self, stage_id: int) -> bool:
        return 0 <= stage_id < self.stages

    @property
    def stage(self) -> int:
        return self.stage_id

    @property
    def num_stages(self) -> int:
        return self.stages

    @property
    def num_micro_batches(self) -> int:
        return self.micro_batches

    @property
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_id == self.stages - 1

    def _buffer_idx(self, micro_batch_id: int) -> int:
        if not self._valid_micro_batch(micro_batch_id):
            raise ValueError(f"micro-batch {micro_batch_id} is outside 0..{self.micro_batches - 1}")
        return micro_batch_id % self.num_pipe_buffers()

    def __iter__(self) -> Iterator[list[PipeInstruction]]:
        return iter(self.steps())


class InferenceSchedule(PipeSchedule):
    """Forwards only, ``micro_batches + stages - 1`` steps, two buffers alternating (even and odd stages
    swap their order of send and receive, so blocking point-to-point calls pair up)."""

    def steps(self) -> Iterator[list[PipeInstruction]]:
        even = self.stage_id % 2 == 0
        for step_id in range(self.micro_batches + self.stages - 1):
            mb = step_id - self.stage_id
            recv_buf, send_buf = (
                (step_id % 2, (step_id + 1) % 2) if even else ((step_id + 1) % 2, step_id % 2)
            )
            cmds: list[PipeInstruction] = []
            if (self.is_first_stage or self.is_last_stage) and self._valid_micro_batch(mb):
                cmds.append(LoadMicroBatch(recv_buf))
            send = self._valid_stage(self.next_stage) and self._valid_micro_batch(mb - 1)
            recv = self._valid_stage(self.prev_stage) and self._valid_micro_batch(mb)
            exchange = [SendActivation(send_buf)] * send + [RecvActivation(recv_buf)] * recv
            cmds.extend(exchange if even else exchange[::-1])
            if self._valid_micro_batch(mb):
                cmds.append(ForwardPass(recv_buf))
            yield cmds

    def num_pipe_buffers(self) -> int:
        return 2


class TrainSchedule(PipeSchedule):
    """DeepSpeed's synchronous 1F1B: ``2 * (micro_batches + stages - 1)`` steps; a stage runs forwards on
    steps of its own parity and backwards on the others; the last step reduces and steps the optimizer."""

    def steps(self) -> Iterator[list[PipeInstruction]]:
        prev_mb = -1
        total = 2 * (self.micro_batches + self.stages - 1)
        for step_id in range(total):
            mb, forward = self._step_to_micro_batch(step_id)
            cmds: list[PipeInstruction] = []
            prev_ok, curr_ok = self._valid_micro_batch(prev_mb), self._valid_micro_batch(mb)
            if forward:
                if prev_ok and self._valid_stage(self.prev_stage):
                    cmds.append(SendGrad(self._buffer_idx(prev_mb)))
                if curr_ok and self._valid_stage(self.prev_stage):
                    cmds.append(RecvActivation(self._buffer_idx(mb)))
            else:
                if curr_ok and self._valid_stage(self.next_stage):
                    cmds.append(RecvGrad(self._buffer_idx(mb)))
                if prev_ok and self._valid_stage(self.next_stage):
                    cmds.append(SendActivation(self._buffer_idx(prev_mb)))
            if (self.is_first_stage or self.is_last_stage) and forward and curr_ok:
                cmds.append(LoadMicroBatch(self._buffer_idx(mb)))
            if curr_ok:
                cmds.append((ForwardPass if forward else BackwardPass)(self._buffer_idx(mb)))
            if step_id == total - 1:
                cmds += [ReduceTiedGrads(), ReduceGrads(), OptimizerStep()]
            prev_mb = mb
            yield cmds

    def num_pipe_buffers(self) -> int:
        """The most micro-batches in flight on this stage: ``stages - stage_id`` (at least 2)."""
        return max(2, min(self.stages - self.stage_id, self.micro_batches))

    def _step_to_micro_batch(self, step_id: int) -> tuple[int, bool]:
        """(micro-batch, is forward) of a step: forwards on the stage's parity, micro-batch
        ``step // 2 - stage // 2``; backwards otherwise, ``step // 2 - stages + 1 + stage // 2``."""
        half, stage_half = step_id // 2, self.stage_id // 2
        if step_id % 2 == self.stage_id % 2:
            return half - stage_half, True
        return half - self.stages + 1 + stage_half, False


class DataParallelSchedule(PipeSchedule):
    """Gradient accumulation without a pipeline: load, forward, backward per micro-batch, then step."""

    def steps(self) -> Iterator[list[PipeInstruction]]:
        for step_id in range(self.micro_batches):
            cmds: list[PipeInstruction] = [LoadMicroBatch(0), ForwardPass(0), BackwardPass(0)]
            if step_id == self.micro_batches - 1:
                cmds += [ReduceGrads(), OptimizerStep()]
            yield cmds

    def num_pipe_buffers(self) -> int:
        return 1
