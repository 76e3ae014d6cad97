"""DeepSpeed's ``DeepSpeedAccelerator``: the abstract interface every accelerator implements.

Code that checks ``isinstance(get_accelerator(), DeepSpeedAccelerator)``, or subclasses it to plug its own
device in through ``set_accelerator``, needs the class. ds's ``Accelerator`` (CUDA and CPU) derives from it;
``set_accelerator`` takes only instances of it, as DeepSpeed's does. The abstract methods are DeepSpeed's,
with its parameter names; the few with a body do what DeepSpeed's base does.
"""

from __future__ import annotations

import abc
from typing import Any

__all__ = ["DeepSpeedAccelerator"]


class DeepSpeedAccelerator(abc.ABC):
    """The accelerator interface (device, RNG, streams, memory, dtypes, graphs, op builders)."""

    supports_nvtx_domain = False

    def __init__(self) -> None:
        self._name: str | None = None
        self._communication_backend_name: str | None = None
        self._compile_backend: str | None = None

    # ------------------------------------------------------------------ device
    @abc.abstractmethod
    def is_synchronized_device(self) -> bool: ...
    @abc.abstractmethod
    def use_host_timers(self) -> bool: ...
    @abc.abstractmethod
    def resolves_data_dependency(self) -> bool: ...
    @abc.abstractmethod
    def handles_memory_backpressure(self) -> bool: ...
    @abc.abstractmethod
    def device_name(self, device_index: int | None = None) -> str: ...
    @abc.abstractmethod
    def device(self, device_index: int | None = None) -> Any: ...
    @abc.abstractmethod
    def set_device(self, device_index: int) -> None: ...
    @abc.abstractmethod
    def current_device(self) -> int: ...
    @abc.abstractmethod
    def current_device_name(self) -> str: ...
    @abc.abstractmethod
    def device_count(self) -> int: ...
    @abc.abstractmethod
    def synchronize(self, device_index: int | None = None) -> None: ...

    # ------------------------------------------------------------------ RNG
    @abc.abstractmethod
    def random(self) -> Any: ...
    @abc.abstractmethod
    def set_rng_state(self, new_state: Any, device_index: int | None = None) -> None: ...
    @abc.abstractmethod
    def get_rng_state(self, device_index: int | None = None) -> Any: ...
    @abc.abstractmethod
    def manual_seed(self, seed: int) -> None: ...
    @abc.abstractmethod
    def manual_seed_all(self, seed: int) -> None: ...
    @abc.abstractmethod
    def initial_seed(self) -> int: ...
    @abc.abstractmethod
    def default_generator(self, device_index: int) -> Any: ...

    # ------------------------------------------------------------------ streams and events
    @property
    @abc.abstractmethod
    def Stream(self) -> type: ...  # noqa: N802 - DeepSpeed's name
    @abc.abstractmethod
    def stream(self, stream: Any) -> Any: ...
    @abc.abstractmethod
    def current_stream(self, device_index: int | None = None) -> Any: ...
    @abc.abstractmethod
    def default_stream(self, device_index: int | None = None) -> Any: ...
    @property
    @abc.abstractmethod
    def Event(self) -> type: ...  # noqa: N802 - DeepSpeed's name

    # ------------------------------------------------------------------ memory
    @abc.abstractmethod
    def empty_cache(self) -> None: ...
    @abc.abstractmethod
    def memory_allocated(self, device_index: int | None = None) -> int: ...
    @abc.abstractmethod
    def max_memory_allocated(self, device_index: int | None = None) -> int: ...
    @abc.abstractmethod
    def reset_max_memory_allocated(self, device_index: int | None = None) -> None: ...
    @abc.abstractmethod
    def memory_cached(self, device_index: int | None = None) -> int: ...
    @abc.abstractmethod
    def max_memory_cached(self, device_index: int | None = None) -> int: ...
    @abc.abstractmethod
    def reset_max_memory_cached(self, device_index: int | None = None) -> None: ...
    @abc.abstractmethod
    def memory_stats(self, device_index: int | None = None) -> dict[str, Any]: ...
    @abc.abstractmethod
    def reset_peak_memory_stats(self, device_index: int | None = None) -> None: ...
    @abc.abstractmethod
    def memory_reserved(self, device_index: int | None = None) -> int: ...
    @abc.abstractmethod
    def max_memory_reserved(self, device_index: int | None = None) -> int: ...
    @abc.abstractmethod
    def total_memory(self, device_index: int | None = None) -> int: ...
    @abc.abstractmethod
    def available_memory(self, device_index: int | None = None) -> int: ...

    # ------------------------------------------------------------------ dtypes and misc
    @abc.abstractmethod
    def is_bf16_supported(self) -> bool: ...
    @abc.abstractmethod
    def is_fp16_supported(self) -> bool: ...

    def is_fp64_supported(self) -> bool:
        return True

    @abc.abstractmethod
    def supported_dtypes(self) -> list[Any]: ...
    @abc.abstractmethod
    def is_available(self) -> bool: ...
    @abc.abstractmethod
    def range_push(self, msg: str, domain: Any = None, category: Any = None) -> None: ...
    @abc.abstractmethod
    def range_pop(self, domain: Any = None) -> None: ...
    @abc.abstractmethod
    def lazy_call(self, callback: Any) -> None: ...
    @abc.abstractmethod
    def communication_backend_name(self) -> str: ...
    @abc.abstractmethod
    def is_triton_supported(self) -> bool: ...

    def prefer_triton_grouped_mm(self) -> bool:
        return False

    # ------------------------------------------------------------------ graphs
    def is_current_stream_capturing(self) -> bool:
        return False

    @abc.abstractmethod
    def create_graph(self) -> Any: ...
    @abc.abstractmethod
    def capture_to_graph(self, graph: Any, pool: Any = None, stream: Any = None) -> Any: ...
    @abc.abstractmethod
    def replay_graph(self, graph: Any) -> Any: ...

    # ------------------------------------------------------------------ tensor constructors
    @property
    @abc.abstractmethod
    def BFloat16Tensor(self) -> Any: ...  # noqa: N802 - DeepSpeed's name
    @property
    @abc.abstractmethod
    def ByteTensor(self) -> Any: ...  # noqa: N802
    @property
    @abc.abstractmethod
    def DoubleTensor(self) -> Any: ...  # noqa: N802
    @property
    @abc.abstractmethod
    def FloatTensor(self) -> Any: ...  # noqa: N802
    @property
    @abc.abstractmethod
    def HalfTensor(self) -> Any: ...  # noqa: N802
    @property
    @abc.abstractmethod
    def IntTensor(self) -> Any: ...  # noqa: N802
    @property
    @abc.abstractmethod
    def LongTensor(self) -> Any: ...  # noqa: N802

    # ------------------------------------------------------------------ host memory
    # host memory: torch's page-locking, as DeepSpeed's base (a device without pinning overrides these)
    def pin_memory(self, tensor: Any, make_copy: bool = True, match_shape: bool = True) -> Any:
        if make_copy:
            return tensor.pin_memory()
        shape = tensor.shape if match_shape else (tensor.numel(),)
        return tensor.new_empty(shape, pin_memory=True)

    def pin_empty(self, *size: Any, dtype: Any, device: Any = "cpu") -> Any:
        import torch

        if torch.device(device).type != "cpu":
            raise ValueError(f"pin_empty allocates host memory; device must be cpu, got {device!r}")
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        return torch.empty(shape, dtype=dtype, device="cpu", pin_memory=True)

    def pin_empty_like(self, tensor: Any, device: Any = "cpu", dtype: Any = None) -> Any:
        return self.pin_empty(tuple(tensor.shape), dtype=dtype or tensor.dtype, device=device)

    def is_pinned(self, tensor: Any) -> bool:
        return tensor.is_pinned()

    def unpin_memory(self, tensor: Any) -> None:
        """Undo ``pin_memory`` of a natively pinned buffer: ds pins through torch only, so nothing to do."""
        return None

    def register_host_memory(self, address: int, num_bytes: int) -> bool:
        """Register page-locked host memory with the device runtime: ds does not (False)."""
        return False

    def unregister_host_memory(self, address: int) -> None:
        return None

    def pin_memory_alignment(self) -> int:
        """Byte alignment required for device-registered host memory; 1 means none."""
        return 1

    @abc.abstractmethod
    def on_accelerator(self, tensor: Any) -> bool: ...

    # ------------------------------------------------------------------ op builders and launch
    @abc.abstractmethod
    def op_builder_dir(self) -> str: ...
    @abc.abstractmethod
    def create_op_builder(self, class_name: str) -> Any: ...
    @abc.abstractmethod
    def get_op_builder(self, class_name: str) -> Any: ...
    @abc.abstractmethod
    def build_extension(self) -> Any: ...
    @abc.abstractmethod
    def export_envs(self) -> list[str]: ...
    @abc.abstractmethod
    def visible_devices_envs(self) -> list[str]: ...
    @abc.abstractmethod
    def set_visible_devices_envs(
        self, current_env: dict[str, str], local_accelerator_ids: list[int]
    ) -> None: ...
    @abc.abstractmethod
    def get_compile_backend(self) -> str: ...
    @abc.abstractmethod
    def set_compile_backend(self, backend: str) -> None: ...
