"""DeepSpeed's ``deepspeed.accelerator``: ``get_accelerator()`` for CUDA and for the CPU.

Scripts written since 2023 do ``from deepspeed.accelerator import get_accelerator`` and then ask it for
the device, the RNG, memory figures, streams and the communication backend. ``Accelerator`` answers from
torch (``torch.cuda`` on CUDA; the host on CPU, where streams and events are harmless no-ops and memory
figures are 0, as in DeepSpeed's CPU accelerator). The backend name agrees with ``ds_launch`` ("nccl" on
CUDA, "gloo" on CPU; DeepSpeed's CPU accelerator says "ccl", which needs oneCCL that ds does not use).

``DS_ACCELERATOR=cpu`` or ``=cuda`` picks one explicitly, as in DeepSpeed; otherwise CUDA when available.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
from ds_engine._missing import missing_function
from ds_launch import discover_from_env

from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator

__all__ = [
    "Accelerator",
    "DeepSpeedAccelerator",
    "get_accelerator",
    "is_current_accelerator_supported",
    "set_accelerator",
]

_SUPPORTED = ("cuda", "cpu")


class _NullStream:
    """A CPU stand-in for ``torch.cuda.Stream``: work is already ordered, so waiting does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _NullEvent:
        return event if event is not None else _NullEvent()

    def query(self) -> bool:
        return True


class _NullEvent:
    """A CPU stand-in for ``torch.cuda.Event``; ``elapsed_time`` is measured on the host clock."""

    def __init__(self, *args: Any, enable_timing: bool = False, **kwargs: Any) -> None:
        self._time_s = 0.0

    def record(self, stream: Any = None) -> None:
        import time

        self._time_s = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _NullEvent) -> float:
        return (end._time_s - self._time_s) * 1e3


class Accelerator(DeepSpeedAccelerator):
    """DeepSpeed's accelerator interface over one torch device type (``"cuda"`` or ``"cpu"``)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        if name not in _SUPPORTED:
            raise ValueError(
                f"accelerator {name!r} is not supported by ds; use one of {', '.join(_SUPPORTED)} "
                "(set DS_ACCELERATOR accordingly)"
            )
        self._name = name
        self._cuda = name == "cuda"
        self._communication_backend_name = self.communication_backend_name()
        self._compile_backend = "inductor"

    def __repr__(self) -> str:
        return f"Accelerator({self._name!r})"

    # ------------------------------------------------------------------ device
    def device_name(self, device_index: int | None = None) -> str:
        """``"cuda"`` / ``"cuda:1"`` or ``"cpu"`` (the CPU has no index)."""
        if device_index is None or not self._cuda:
            return self._name
        return f"{self._name}:{device_index}"

    def current_device_name(self) -> str:
        return f"cuda:{torch.cuda.current_device()}" if self._cuda else "cpu"

    def device(self, device_index: int | None = None) -> torch.device:
        return torch.device(self.device_name(device_index))

    def set_device(self, device_index: int) -> None:
        if self._cuda:
            torch.cuda.set_device(device_index)

    def current_device(self) -> int:
        return torch.cuda.current_device() if self._cuda else 0

    def device_count(self) -> int:
        """CUDA devices; on the CPU, as DeepSpeed's CPU accelerator: ``LOCAL_SIZE`` when set, else the
        launcher's local world size (``LOCAL_WORLD_SIZE``, Open MPI's, PMI's, SLURM's), else 1. Scripts
        size their process groups from it, so a CPU job of 4 ranks per host answers 4. (DeepSpeed falls
        back to the NUMA node count; ds falls back to 1, one process per rank.)"""
        if self._cuda:
            return torch.cuda.device_count()
        return _cpu_local_world_size(os.environ)

    def is_available(self) -> bool:
        return torch.cuda.is_available() if self._cuda else True

    def synchronize(self, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.synchronize(device_index)

    def is_synchronized_device(self) -> bool:
        """True on the CPU: work completes in program order, so there is nothing to wait for."""
        return not self._cuda

    def use_host_timers(self) -> bool:
        return not self._cuda

    def resolves_data_dependency(self) -> bool:
        return not self._cuda

    def handles_memory_backpressure(self) -> bool:
        return not self._cuda

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name

    def communication_backend_name(self) -> str:
        return "nccl" if self._cuda else "gloo"

    def visible_devices_envs(self) -> list[str]:
        return ["CUDA_VISIBLE_DEVICES"] if self._cuda else []

    def set_visible_devices_envs(self, current_env: dict[str, str], local_accelerator_ids: list[int]) -> None:
        for env in self.visible_devices_envs():
            current_env[env] = ",".join(map(str, local_accelerator_ids))

    def export_envs(self) -> list[str]:
        return ["NCCL"] if self._cuda else []

    # ------------------------------------------------------------------ RNG
    def random(self) -> Any:
        return torch.random

    def manual_seed(self, seed: int) -> None:
        (torch.cuda.manual_seed if self._cuda else torch.manual_seed)(seed)

    def manual_seed_all(self, seed: int) -> None:
        (torch.cuda.manual_seed_all if self._cuda else torch.manual_seed)(seed)

    def initial_seed(self) -> int:
        return torch.cuda.initial_seed() if self._cuda else torch.initial_seed()

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        if self._cuda:
            return torch.cuda.get_rng_state("cuda" if device_index is None else device_index)
        return torch.get_rng_state()

    def set_rng_state(self, new_state: torch.Tensor, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.set_rng_state(new_state, "cuda" if device_index is None else device_index)
        else:
            torch.set_rng_state(new_state)

    def default_generator(self, device_index: int) -> torch.Generator:
        return torch.cuda.default_generators[device_index] if self._cuda else torch.default_generator

    # ------------------------------------------------------------------ streams and events
    @property
    def Stream(self) -> type:  # noqa: N802 - DeepSpeed's name
        return torch.cuda.Stream if self._cuda else _NullStream

    @property
    def Event(self) -> type:  # noqa: N802 - DeepSpeed's name
        return torch.cuda.Event if self._cuda else _NullEvent

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream) if self._cuda else contextlib.nullcontext()

    def current_stream(self, device_index: int | None = None) -> Any:
        return torch.cuda.current_stream(device_index) if self._cuda else _NullStream()

    def default_stream(self, device_index: int | None = None) -> Any:
        return torch.cuda.default_stream(device_index) if self._cuda else _NullStream()

    def range_push(self, msg: str, domain: Any = None, category: Any = None) -> None:
        if self._cuda:
            torch.cuda.nvtx.range_push(msg)

    def range_pop(self, domain: Any = None) -> None:
        if self._cuda:
            torch.cuda.nvtx.range_pop()

    def lazy_call(self, callback: Callable[[], Any]) -> None:
        if self._cuda:
            torch.cuda._lazy_call(callback)
        else:
            callback()

    # ------------------------------------------------------------------ memory (bytes; 0 on the CPU)
    def _memory(self, fn: str, device_index: int | None = None) -> int:
        return int(getattr(torch.cuda, fn)(device_index)) if self._cuda else 0

    def memory_allocated(self, device_index: int | None = None) -> int:
        return self._memory("memory_allocated", device_index)

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return self._memory("max_memory_allocated", device_index)

    def memory_reserved(self, device_index: int | None = None) -> int:
        return self._memory("memory_reserved", device_index)

    def max_memory_reserved(self, device_index: int | None = None) -> int:
        return self._memory("max_memory_reserved", device_index)

    memory_cached = memory_reserved
    max_memory_cached = max_memory_reserved

    def reset_max_memory_allocated(self, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(device_index)

    reset_max_memory_cached = reset_max_memory_allocated
    reset_peak_memory_stats = reset_max_memory_allocated

    def memory_stats(self, device_index: int | None = None) -> dict[str, Any]:
        return torch.cuda.memory_stats(device_index) if self._cuda else {}

    def empty_cache(self) -> None:
        if self._cuda:
            torch.cuda.empty_cache()

    def total_memory(self, device_index: int | None = None) -> int:
        if self._cuda:
            return int(torch.cuda.get_device_properties(device_index or 0).total_memory)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def available_memory(self, device_index: int | None = None) -> int:
        if self._cuda:
            free, _ = torch.cuda.mem_get_info(device_index)
            return int(free)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")

    def pin_memory(
        self, tensor: torch.Tensor, make_copy: bool = True, match_shape: bool = True
    ) -> torch.Tensor:
        """Page-locked copy when CUDA exists (it speeds host<->device copies); the tensor itself on CPU.
        ``make_copy=False``: a fresh pinned buffer of the tensor's shape (flat without ``match_shape``)."""
        if not make_copy:
            shape = tensor.shape if match_shape else (tensor.numel(),)
            return self.pin_empty(shape, dtype=tensor.dtype)
        return tensor.pin_memory() if self._cuda else tensor

    def pin_empty(self, *size: Any, dtype: torch.dtype, device: Any = "cpu") -> torch.Tensor:
        """An uninitialised host tensor, page-locked when CUDA exists."""
        if self._cuda:
            return super().pin_empty(*size, dtype=dtype, device=device)
        if torch.device(device).type != "cpu":
            raise ValueError(f"pin_empty allocates host memory; device must be cpu, got {device!r}")
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        return torch.empty(shape, dtype=dtype)

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned() if self._cuda else False

    # ------------------------------------------------------------------ dtypes
    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported() if self._cuda else True

    def is_fp16_supported(self) -> bool:
        """True on CUDA; on the CPU fp16 works in ds (slowly), so True there too."""
        return True

    def supported_dtypes(self) -> list[torch.dtype]:
        dtypes = [torch.float32, torch.float16]
        return dtypes + [torch.bfloat16] if self.is_bf16_supported() else dtypes

    def is_triton_supported(self) -> bool:
        return self._cuda

    def amp(self) -> Any:
        return torch.amp

    def _tensor_of(self, dtype: torch.dtype) -> Any:
        return functools.partial(torch.tensor, dtype=dtype, device=self._name)

    BFloat16Tensor = property(lambda self: self._tensor_of(torch.bfloat16))
    ByteTensor = property(lambda self: self._tensor_of(torch.uint8))
    DoubleTensor = property(lambda self: self._tensor_of(torch.float64))
    FloatTensor = property(lambda self: self._tensor_of(torch.float32))
    HalfTensor = property(lambda self: self._tensor_of(torch.float16))
    IntTensor = property(lambda self: self._tensor_of(torch.int32))
    LongTensor = property(lambda self: self._tensor_of(torch.int64))

    # ------------------------------------------------------------------ graphs (CUDA graphs; none on the CPU)
    def create_graph(self) -> Any:
        return torch.cuda.CUDAGraph() if self._cuda else None

    def capture_to_graph(self, graph: Any, pool: Any = None, stream: Any = None) -> Any:
        return torch.cuda.graph(graph, pool, stream) if self._cuda else contextlib.nullcontext()

    def replay_graph(self, graph: Any) -> None:
        if self._cuda:
            graph.replay()

    # ------------------------------------------------------------------ compile
    def get_compile_backend(self) -> str:
        return self._compile_backend

    def set_compile_backend(self, backend: str) -> None:
        self._compile_backend = backend

    # ------------------------------------------------------------------ op builders (DeepSpeed's C++ ops)
    create_op_builder = missing_function(
        "deepspeed.accelerator.DeepSpeedAccelerator",
        "create_op_builder",
        "DeepSpeed's op builders (get_accelerator().create_op_builder: its compiled C++ ops)",
        "Use the torch implementations through deepspeed.ops (FusedAdam, DeepSpeedCPUAdam, FusedLamb).",
    )
    get_op_builder = missing_function(
        "deepspeed.accelerator.DeepSpeedAccelerator",
        "get_op_builder",
        "DeepSpeed's op builders (get_accelerator().get_op_builder: its compiled C++ ops)",
        "Use the torch implementations through deepspeed.ops (FusedAdam, DeepSpeedCPUAdam, FusedLamb).",
    )

    def op_builder_dir(self) -> str:
        """Where the builder classes live: ds's are all in ``deepspeed.ops.op_builder``."""
        return "deepspeed.ops.op_builder"

    def build_extension(self) -> Any:
        """torch's ``BuildExtension``, for a project's own setup.py (ds builds no DeepSpeed ops)."""
        from torch.utils.cpp_extension import BuildExtension

        return BuildExtension


_current: Accelerator | None = None


def get_accelerator() -> Accelerator:
    """The accelerator of this process: ``DS_ACCELERATOR`` if set, else CUDA when available, else the CPU."""
    global _current
    if _current is None:
        name = os.environ.get("DS_ACCELERATOR") or ("cuda" if torch.cuda.is_available() else "cpu")
        _current = Accelerator(name)
    return _current


def set_accelerator(accel_obj: DeepSpeedAccelerator) -> None:
    """Use ``accel_obj`` from now on (DeepSpeed's override hook); it must be a DeepSpeedAccelerator."""
    global _current
    if not isinstance(accel_obj, DeepSpeedAccelerator):
        raise TypeError(
            f"set_accelerator: {type(accel_obj).__name__} accelerator is not subclass of DeepSpeedAccelerator "
            "(deepspeed.accelerator.DeepSpeedAccelerator); subclass it, or use get_accelerator()'s"
        )
    _current = accel_obj


def is_current_accelerator_supported() -> bool:
    return get_accelerator()._name in _SUPPORTED


def _cpu_local_world_size(env: Mapping[str, str]) -> int:
    local_size = env.get("LOCAL_SIZE", "")
    if local_size.strip().isdigit() and int(local_size) > 0:
        return int(local_size)
    found = discover_from_env(env)
    return found.local_world_size if found is not None and found.local_world_size else 1
