"""``deepspeed.zero`` names over ds_zero's stage 3: ``Init`` and ``GatheredParameters``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ds_zero import GatheredParameters, PartitionOnConstruction
from ds_zero.stage3 import ZeroParamStatus, register_external_parameter
from torch import nn

from ds_engine._dist import init_distributed

logger = logging.getLogger("ds_engine")

__all__ = [
    "GatheredParameters",
    "Init",
    "ZeroParamStatus",
    "check_partitioned_model",
    "register_external_parameter",
]


class Init(PartitionOnConstruction):
    """DeepSpeed's ``zero.Init``: modules built inside are partitioned as each is constructed.

    The whole model never exists on one rank; ``ds_engine.initialize`` with a stage-3 config then
    trains it. ``dtype`` defaults to the config's (fp16 -> float16, bf16 -> bfloat16, else unchanged).
    ``module`` partitions an already built module instead. ``remote_device="cpu"`` keeps the chunks in
    CPU memory; so does ``remote_device="nvme"`` (DeepSpeed writes each partition to ``nvme_path`` as it is
    made): ds keeps this rank's partitions in CPU memory until ``initialize`` moves them into
    ``offload_param.nvme_path`` (the config must set ``offload_param.device: "nvme"``), and says so once in
    the log. Accepted and without effect here (each says why): ``mem_efficient_linear`` (torch's
    linear already frees what it can), ``pin_memory`` (CPU chunks are only staging until initialize).
    """

    def __init__(
        self,
        module: nn.Module | None = None,
        data_parallel_group: Any = None,
        mem_efficient_linear: bool = True,
        remote_device: str | None = None,
        pin_memory: bool = False,
        config_dict_or_path: dict | str | None = None,
        config: dict | str | None = None,
        enabled: bool = True,
        dtype: torch.dtype | None = None,
        mpu: Any = None,
        zero_quantized_weights: bool = False,
        zero_quantized_nontrainable_weights: bool = False,
        **unsupported: Any,
    ) -> None:
        if remote_device == "nvme":
            _check_nvme_config(config_dict_or_path or config)
        if zero_quantized_weights or zero_quantized_nontrainable_weights:
            raise ValueError(
                "zero.Init: ds takes ZeRO++'s quantized weights from the config, not from zero.Init: set "
                "zero_optimization.zero_quantized_weights or zero_quantized_nontrainable_weights instead of "
                "the flag"
            )
        for key, value in unsupported.items():
            if value not in (None, False):
                raise ValueError(f"zero.Init({key}=...) is not supported by ds; remove it")
        if enabled and not dist.is_initialized():
            init_distributed()
        group = mpu.get_data_parallel_group() if mpu is not None else data_parallel_group
        device = "cpu" if remote_device in ("cpu", "nvme") else None
        super().__init__(group, dtype=dtype or _config_dtype(config_dict_or_path or config), device=device,
                         enabled=enabled)  # fmt: skip
        if module is not None and enabled:
            for m in module.modules():
                self.partition_module(m)


def _check_nvme_config(config: dict | str | None) -> None:
    """``remote_device="nvme"``: the config must put the parameters on nvme (DeepSpeed reads its nvme_path there);
    ds keeps the partitions in CPU memory until initialize, which the log says once."""
    if config is not None and not isinstance(config, dict):
        config = json.loads(Path(config).read_text())
    offload = ((config or {}).get("zero_optimization") or {}).get("offload_param") or {}
    if offload.get("device") != "nvme":
        raise ValueError(
            "zero.Init(remote_device='nvme') needs a config (config_dict_or_path) whose "
            "zero_optimization.offload_param.device is 'nvme' with an nvme_path; use remote_device='cpu' or "
            "None to keep the partitions in memory"
        )
    if not _said_nvme:
        _said_nvme.append(True)
        logger.warning(
            "zero.Init(remote_device='nvme'): ds keeps this rank's partitions in CPU memory while the model is "
            "built (DeepSpeed writes them to disk as they are made); initialize() moves them into "
            "offload_param.nvme_path %s",
            offload.get("nvme_path"),
        )


_said_nvme: list[bool] = []


def _config_dtype(config: dict | str | None) -> torch.dtype | None:
    if config is None:
        return None
    if not isinstance(config, dict):
        config = json.loads(Path(config).read_text())
    if config.get("fp16", {}).get("enabled"):
        return torch.float16
    if config.get("bf16", {}).get("enabled"):
        return torch.bfloat16
    return None


def check_partitioned_model(model: nn.Module, stage: int) -> None:
    """A model built inside ``zero.Init`` trains only at stage 3: say so instead of failing on empty weights."""
    if stage != 3 and any(hasattr(p, "ds_chunk") for p in model.parameters()):
        raise ValueError(
            f"the model was built inside ds_engine.zero.Init, which partitions it for ZeRO stage 3, but "
            f"zero_optimization.stage is {stage}; set the stage to 3 or build the model outside zero.Init"
        )
