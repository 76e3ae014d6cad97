"""Process-wide activation-checkpointing settings, set by ``configure()`` as in ``deepspeed.checkpointing``."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from ds_config import ActivationCheckpointingConfig, DSConfig

from ._errors import ActivationCheckpointingConfigError
from ._partition import ContiguousBufferPool
from ._profile import ActivationProfile

_SECTION = "activation_checkpointing"


@dataclass(frozen=True)
class ActivationCheckpointingSettings:
    """The ``activation_checkpointing`` config section; field names equal the JSON keys.

    ``partition_activations``: each model-parallel rank keeps a 1/mp slice of every saved input,
    gathered with ``all_gather`` in backward. ``cpu_checkpointing``: saved inputs live on the CPU.
    ``contiguous_memory_optimization``: saved (partitioned) inputs are copied into
    ``number_checkpoints`` preallocated buffers. ``synchronize_checkpoint_boundary``: device
    synchronize at each checkpoint boundary. ``profile``: time forward, recompute and backward.
    """

    partition_activations: bool = False
    cpu_checkpointing: bool = False
    contiguous_memory_optimization: bool = False
    number_checkpoints: int | None = None
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False

    @classmethod
    def from_config(cls, section: ActivationCheckpointingConfig) -> ActivationCheckpointingSettings:
        """Build from the ``activation_checkpointing`` section model."""
        if not isinstance(section, ActivationCheckpointingConfig):
            raise TypeError(
                "ActivationCheckpointingSettings.from_config takes ds_config.ActivationCheckpointingConfig, "
                f"got {type(section).__name__}"
            )
        settings = cls(
            partition_activations=section.partition_activations,
            cpu_checkpointing=section.cpu_checkpointing,
            contiguous_memory_optimization=section.contiguous_memory_optimization,
            number_checkpoints=section.number_checkpoints,
            synchronize_checkpoint_boundary=section.synchronize_checkpoint_boundary,
            profile=section.profile,
        )
        settings.validate()
        return settings

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any]) -> ActivationCheckpointingSettings:
        """Build from the raw JSON dict of the section; an unknown key is an error naming its path."""
        known = [f.name for f in dataclasses.fields(cls)]
        for key in section:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = (
                    f"; did you mean '{_SECTION}.{close[0]}'?"
                    if close
                    else f"; known keys: {', '.join(known)}"
                )
                raise ActivationCheckpointingConfigError(f"unknown config key '{_SECTION}.{key}'{hint}")
        settings = cls(**dict(section))
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise ``ActivationCheckpointingConfigError`` for values or combinations that cannot work."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "number_checkpoints" and not isinstance(value, bool):
                raise ActivationCheckpointingConfigError(
                    f"'{_SECTION}.{f.name}' must be true or false, got {value!r}"
                )
        n = self.number_checkpoints
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ActivationCheckpointingConfigError(
                f"'{_SECTION}.number_checkpoints' must be a positive integer or null, got {n!r}"
            )
        if self.contiguous_memory_optimization and not self.partition_activations:
            raise ActivationCheckpointingConfigError(
                "Contiguous Checkpointing is only available with partitioned activations. Set "
                f"'{_SECTION}.partition_activations' to true (configure(partition_activations=True)), "
                f"or set '{_SECTION}.contiguous_memory_optimization' to false"
            )
        if self.contiguous_memory_optimization and n is None:
            raise ActivationCheckpointingConfigError(
                "Must specify the number of layers with contiguous memory checkpointing: set "
                f"'{_SECTION}.number_checkpoints' (configure(num_checkpoints=...)) to the number of "
                "checkpoint() calls in one forward pass"
            )


@dataclass
class _Runtime:
    settings: ActivationCheckpointingSettings = dataclasses.field(
        default_factory=ActivationCheckpointingSettings
    )
    mpu: Any = None
    configured: bool = False
    pool: ContiguousBufferPool | None = None
    profile: ActivationProfile = dataclasses.field(default_factory=ActivationProfile)


_RUNTIME = _Runtime()


def runtime() -> _Runtime:
    """The process-wide settings every ``checkpoint()`` call reads."""
    return _RUNTIME


def model_parallel_info(mpu: Any) -> tuple[int, int, dist.ProcessGroup | None]:
    """``(rank, world_size, group)`` of the model-parallel group; no mpu means a group of one.

    Accepts DeepSpeed's mpu protocol (``get_model_parallel_rank/world_size/group``) and the newer
    Megatron spelling (``get_tensor_model_parallel_*``).
    """
    if mpu is None:
        return 0, 1, None
    for prefix in ("get_model_parallel_", "get_tensor_model_parallel_"):
        names = [prefix + suffix for suffix in ("rank", "world_size", "group")]
        if all(callable(getattr(mpu, name, None)) for name in names):
            rank, size, group = (getattr(mpu, name)() for name in names)
            return int(rank), int(size), group
    raise TypeError(
        f"mpu object of type {type(mpu).__name__} must provide get_model_parallel_rank(), "
        "get_model_parallel_world_size() and get_model_parallel_group() (or the "
        "get_tensor_model_parallel_* spelling)"
    )


def settings_from_deepspeed_config(deepspeed_config: Any) -> ActivationCheckpointingSettings:
    """Read the section from what ``configure(deepspeed_config=...)`` accepts.

    That is: a JSON file path, the whole config as a dict, a ``ds_config.DSConfig``, or its
    ``ActivationCheckpointingConfig`` section.
    """
    if isinstance(deepspeed_config, (str, os.PathLike)):
        with open(deepspeed_config, encoding="utf-8") as f:
            deepspeed_config = json.load(f)
    if isinstance(deepspeed_config, Mapping):
        section = deepspeed_config.get(_SECTION) or {}
        if not isinstance(section, Mapping):
            raise ActivationCheckpointingConfigError(f"'{_SECTION}' must be an object, got {section!r}")
        return ActivationCheckpointingSettings.from_mapping(section)
    if isinstance(deepspeed_config, DSConfig):
        return ActivationCheckpointingSettings.from_config(deepspeed_config.activation_checkpointing)
    if isinstance(deepspeed_config, ActivationCheckpointingConfig):
        return ActivationCheckpointingSettings.from_config(deepspeed_config)
    raise TypeError(
        "deepspeed_config must be a JSON path, a config dict, a ds_config.DSConfig, or its "
        f"ActivationCheckpointingConfig section; got {type(deepspeed_config).__name__}"
    )


def configure(
    mpu_: Any = None,
    deepspeed_config: Any = None,
    partition_activations: bool | None = None,
    contiguous_checkpointing: bool | None = None,
    num_checkpoints: int | None = None,
    checkpoint_in_cpu: bool | None = None,
    synchronize: bool | None = None,
    profile: bool | None = None,
) -> ActivationCheckpointingSettings:
    """Set the process-wide activation-checkpointing behaviour (DeepSpeed's signature).

    Starts from the defaults, applies ``deepspeed_config`` (JSON path, config dict, config object or
    its ``activation_checkpointing`` section), then every keyword that is not None. ``mpu_`` provides
    the model-parallel group (``get_model_parallel_rank/world_size/group``); None means no model
    parallelism. Returns the settings now in force.
    """
    settings = ActivationCheckpointingSettings()
    if deepspeed_config is not None:
        settings = settings_from_deepspeed_config(deepspeed_config)
    overrides = {
        "partition_activations": partition_activations,
        "contiguous_memory_optimization": contiguous_checkpointing,
        "number_checkpoints": num_checkpoints,
        "cpu_checkpointing": checkpoint_in_cpu,
        "synchronize_checkpoint_boundary": synchronize,
        "profile": profile,
    }
    settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    settings.validate()
    model_parallel_info(mpu_)  # fail now, not in the middle of a forward pass
    _RUNTIME.settings = settings
    _RUNTIME.mpu = mpu_
    _RUNTIME.configured = True
    _RUNTIME.pool = _new_pool(settings)
    _RUNTIME.profile.clear()
    return settings


def _new_pool(settings: ActivationCheckpointingSettings) -> ContiguousBufferPool | None:
    if not settings.contiguous_memory_optimization:
        return None
    device = torch.device("cpu") if settings.cpu_checkpointing else None
    assert settings.number_checkpoints is not None  # validate() guarantees it
    return ContiguousBufferPool(settings.number_checkpoints, device)


def is_configured() -> bool:
    """True once ``configure()`` has been called in this process."""
    return _RUNTIME.configured


def reset() -> None:
    """Release the contiguous buffers (DeepSpeed's ``checkpointing.reset``).

    Backward releases them by itself; call this after forward passes with gradients enabled that
    are not followed by a backward, or the next forward runs out of buffers.
    """
    if _RUNTIME.pool is not None:
        _RUNTIME.pool.release()


def get_profile() -> ActivationProfile:
    """Times recorded while ``profile`` is on (also logged at INFO to ``ds_checkpoint.activation``)."""
    return _RUNTIME.profile
