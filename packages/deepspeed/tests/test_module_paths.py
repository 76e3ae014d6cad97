"""DeepSpeed's module paths and names that user code imports, against DeepSpeed 0.19.8's record.

The record is ``fixtures/deepspeed_module_names.json``, written by
``DS_ACCELERATOR=cpu $DS_DEEPSPEED_PYTHON tools/fixtures/make_deepspeed_behaviour_fixtures.py``.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_module_names.json").read_text())

# names code imports from each path (DeepSpeed has each one; the test checks that against the record)
USED = {
    "deepspeed.runtime.config": ["DeepSpeedConfig", "DeepSpeedConfigError"],
    "deepspeed.runtime.zero.config": [
        "ZeroStageEnum", "DeepSpeedZeroConfig", "DeepSpeedZeroOffloadParamConfig",
        "DeepSpeedZeroOffloadOptimizerConfig", "OffloadDeviceEnum", "get_zero_config", "ZERO_OPTIMIZATION",
    ],
    "deepspeed.runtime.precision_config": [
        "DeepSpeedFP16Config", "DeepSpeedBF16Config", "get_float16_config", "get_bfloat16_config", "FP16", "BFLOAT16",
    ],
    "deepspeed.runtime.engine": ["DeepSpeedEngine"],
    "deepspeed.runtime.zero": ["ZeroParamStatus", "Init", "GatheredParameters", "partition_parameters", "config"],
    "deepspeed.runtime.activation_checkpointing": ["checkpointing"],
    "deepspeed.utils": [
        "RepeatingLoader", "groups", "logger", "log_dist",
        *(f"safe_{op}_{scope}_{what}" for op in ("get", "set") for scope in ("full", "local")
          for what in ("grad", "fp32_param", "optimizer_state")),
    ],
    "deepspeed.utils.groups": [
        "get_data_parallel_group", "get_data_parallel_world_size", "get_data_parallel_rank",
        "get_model_parallel_world_size", "get_model_parallel_rank", "get_tensor_model_parallel_world_size",
    ],
    "deepspeed.git_version_info": RECORD["deepspeed.git_version_info"]["names"],
    "deepspeed.ops.op_builder": [n for n in RECORD["deepspeed.ops.op_builder"]["names"] if n.endswith("Builder")],
    "deepspeed.launcher.runner": ["main", "parse_args", "DEEPSPEED_ENVIRONMENT_NAME"],
}  # fmt: skip
# *_DEFAULT constants where DeepSpeed's constant is not what DeepSpeed's config uses, or where ds's default
# differs (see docs/deepspeed-api.md): ds's constant says what ds uses.
DEFAULTS_THAT_DIFFER = {
    "STEPS_PER_PRINT_DEFAULT",  # DeepSpeed None (never print); ds 10
    "BFLOAT16_IMMEDIATE_GRAD_UPDATE_DEFAULT",  # DeepSpeed's constant True, its config False (ds: False)
    "FP16_INITIAL_SCALE_POWER_DEFAULT",  # DeepSpeed 16, ds 32: reported, docs/deepspeed-api.md
    "GRADIENT_CLIPPING_DEFAULT",  # DeepSpeed 1.0, ds 0.0: reported, docs/deepspeed-api.md
}


@pytest.mark.parametrize("path", list(USED))
def test_module_path_has_the_names_code_uses(path):
    module = importlib.import_module(path)
    recorded = set(RECORD[path]["names"])
    for name in USED[path]:
        assert name in recorded or path == "deepspeed.runtime.zero", f"{path}.{name} is not DeepSpeed's"
        assert hasattr(module, name), f"{path} lacks {name}"


@pytest.mark.parametrize(
    "path",
    ["deepspeed.runtime.constants", "deepspeed.runtime.precision_config", "deepspeed.runtime.zero.config"],
)
def test_constants_equal_deepspeeds(path):
    module = importlib.import_module(path)
    recorded = RECORD[path]["constants"]
    shared = [n for n in recorded if hasattr(module, n) and not n.endswith("_FORMAT")]
    wrong = {n: (getattr(module, n), recorded[n]) for n in shared if getattr(module, n) != recorded[n]}
    assert set(wrong) <= DEFAULTS_THAT_DIFFER, wrong
    if path == "deepspeed.runtime.constants":
        assert len(shared) >= 70  # the config's key names, generated from ds_config's models


def test_enums_have_deepspeeds_members():
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    assert {m.name: m.value for m in ZeroStageEnum} == RECORD["enums"]["ZeroStageEnum"]
    assert {m.name: m.value for m in ZeroParamStatus} == RECORD["enums"]["ZeroParamStatus"]
    assert ZeroStageEnum.gradients == 2  # compares with ds's int stage


def test_deepspeed_config_reads_as_deepspeeds():
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import ZeroStageEnum

    config = DeepSpeedConfig(
        {
            "train_batch_size": 8,
            "gradient_accumulation_steps": 2,
            "fp16": {"enabled": True},
            "zero_optimization": {"stage": 2},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        }
    )
    assert (config.train_batch_size, config.train_micro_batch_size_per_gpu, config.world_size) == (8, 4, 1)
    assert config.zero_optimization_stage == ZeroStageEnum.gradients and config.zero_enabled
    assert (
        config.zero_config.stage == 2 and config.float16_config.enabled and not config.bfloat16_config.enabled
    )
    assert config.optimizer_name == "adamw" and config.optimizer_params == {"lr": 1e-3}
    assert config._param_dict["fp16"] == {"enabled": True}


def test_git_version_info_and_op_builders_answer_for_ds():
    import deepspeed
    from deepspeed import git_version_info
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder, FusedAdamBuilder

    assert git_version_info.version == deepspeed.__version__
    # DeepSpeed 0.19.8's installed_ops keys on CPU (git_version_info.installed_ops, recorded by hand)
    deepspeed_ops = {"async_io", "deepspeed_ccl_comm", "deepspeed_shm_comm", "cpu_adagrad", "cpu_adam", "cpu_lion",
                     "fused_adam", "pin_memory", "deepspeed_not_implemented"}  # fmt: skip
    assert deepspeed_ops <= set(git_version_info.installed_ops)
    assert git_version_info.installed_ops["cpu_adam"] and git_version_info.installed_ops["async_io"]
    assert CPUAdamBuilder().is_compatible() and FusedAdamBuilder().is_compatible()
    assert AsyncIOBuilder().is_compatible()  # its load() gives aio_handle (test_aio_handle.py)
    assert CPUAdamBuilder.NAME == "cpu_adam"
    DeepSpeedCPUAdam([torch.nn.Parameter(torch.ones(2))])  # what is_compatible() promises
    with pytest.raises(deepspeed.FeatureNotAvailableError, match="DeepSpeedCPUAdam"):
        CPUAdamBuilder().load()
    assert AsyncIOBuilder().load().aio_handle().get_block_size() == 1 << 20


def test_repeating_loader_starts_again():
    from deepspeed.runtime.dataloader import RepeatingLoader as FromRuntime
    from deepspeed.utils import RepeatingLoader

    assert FromRuntime is RepeatingLoader
    loader = RepeatingLoader(torch.utils.data.DataLoader(list(range(3)), batch_size=2))
    got = [batch.tolist() for _, batch in zip(range(5), loader)]
    assert got == [[0, 1], [2], [0, 1], [2], [0, 1]]
    assert iter(loader) is loader


def test_groups_are_the_world_and_this_rank_alone():
    import torch.distributed as dist
    from deepspeed.utils import groups

    initialized = dist.is_initialized()  # another test in this process may have made a world of one
    assert groups.get_data_parallel_world_size() == (dist.get_world_size() if initialized else 1)
    assert groups.get_data_parallel_rank() == 0
    assert groups.get_data_parallel_group() is (dist.group.WORLD if initialized else None)
    assert groups.get_model_parallel_world_size() == 1 and groups.get_tensor_model_parallel_rank() == 0
