"""RNG state capture for recomputation, and the model-parallel RNG tracker.

The "device" generator is CUDA's (current device) when CUDA is available, else the CPU generator:
the tracker then forks the CPU generator, so model-parallel dropout code runs unchanged on CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ._errors import RNGTrackerError
from ._state import model_parallel_info, runtime

_MODEL_PARALLEL_RNG = "model-parallel-rng"
# DeepSpeed/Megatron offset: model-parallel seeds must differ from the data-parallel seed.
_MODEL_PARALLEL_SEED_OFFSET = 2718


def _device_is_cuda() -> bool:
    return torch.cuda.is_available()


def _get_device_rng_state() -> torch.Tensor:
    return torch.cuda.get_rng_state() if _device_is_cuda() else torch.get_rng_state()


def _set_device_rng_state(state: torch.Tensor) -> None:
    if _device_is_cuda():
        torch.cuda.set_rng_state(state)
    else:
        torch.set_rng_state(state)


def _device_manual_seed(seed: int) -> None:
    if _device_is_cuda():
        torch.cuda.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


class RNGStatesTracker:
    """Named device-RNG states, so model-parallel regions draw from their own stream.

    Same semantics as DeepSpeed's ``CudaRNGStatesTracker``: ``add`` seeds a new named state without
    disturbing the current one; ``fork`` swaps a named state in for the body of a ``with`` block and
    keeps the advanced state for the next fork.
    """

    def __init__(self) -> None:
        self._states: dict[str, torch.Tensor] = {}
        self._seeds: set[int] = set()

    def reset(self) -> None:
        """Forget every named state and seed."""
        self._states = {}
        self._seeds = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        """A shallow copy of ``{name: rng state}``; states are replaced, never mutated, so it is a snapshot."""
        return dict(self._states)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        """Replace every named state (e.g. with a ``get_states()`` snapshot)."""
        self._states = dict(states)

    def add(self, name: str, seed: int) -> None:
        """Create state ``name`` as the device RNG right after ``manual_seed(seed)``."""
        if seed in self._seeds:
            raise RNGTrackerError(f"seed {seed} already exists")
        if name in self._states:
            raise RNGTrackerError(f"rng state {name} already exists")
        self._seeds.add(seed)
        current = _get_device_rng_state()
        try:
            _device_manual_seed(seed)
            self._states[name] = _get_device_rng_state()
        finally:
            _set_device_rng_state(current)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG) -> Iterator[None]:
        """Run the body with state ``name`` as the device RNG; restore the previous state afterwards."""
        if name not in self._states:
            raise RNGTrackerError(f"rng state {name} is not added")
        current = _get_device_rng_state()
        _set_device_rng_state(self._states[name])
        try:
            yield
        finally:
            self._states[name] = _get_device_rng_state()
            _set_device_rng_state(current)


_TRACKER = RNGStatesTracker()


def get_rng_tracker() -> RNGStatesTracker:
    """The process-wide model-parallel RNG tracker."""
    return _TRACKER


def model_parallel_manual_seed(seed: int) -> None:
    """Seed the default device RNG with ``seed`` and the tracker's model-parallel state per MP rank.

    ``model-parallel-rng`` gets ``seed + 2718 + mp_rank`` (mp rank from the mpu given to
    ``configure``; 0 without one): distinct across a model-parallel group, identical across its
    data-parallel replicas. The default device RNG gets ``seed``, identical across the group.
    """
    mp_rank, _, _ = model_parallel_info(runtime().mpu)
    _TRACKER.reset()
    _device_manual_seed(seed)
    _TRACKER.add(_MODEL_PARALLEL_RNG, seed + _MODEL_PARALLEL_SEED_OFFSET + mp_rank)


@dataclass(frozen=True)
class RNGSnapshot:
    """Every RNG state a recomputation must replay: CPU, CUDA (if in use) and the tracker's states."""

    cpu: torch.Tensor
    cuda: torch.Tensor | None
    tracker: dict[str, torch.Tensor]

    @classmethod
    def capture(cls) -> RNGSnapshot:
        """Snapshot the current states; CUDA only when already initialised (no context is created)."""
        # is_initialized() is a flag read; is_available() would query the driver on every call.
        cuda_in_use = torch.cuda.is_initialized()
        return cls(
            cpu=torch.get_rng_state(),
            cuda=torch.cuda.get_rng_state() if cuda_in_use else None,
            tracker=_TRACKER.get_states(),
        )

    def restore(self) -> None:
        """Make the captured states current again."""
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda)
        _TRACKER.set_states(self.tracker)
