"""``import deepspeed`` resolves to ds: version checks the frameworks make, module paths, honest failures."""

from __future__ import annotations

import importlib
import logging

import deepspeed
import ds_engine
import pytest
from packaging.requirements import Requirement
from packaging.version import Version


def test_version_is_the_deepspeed_api_level_with_a_ds_label():
    version = Version(deepspeed.__version__)
    assert version.public == deepspeed.DEEPSPEED_API_VERSION == "0.19.8"
    assert version.local == f"ds.{ds_engine.__version__}"
    assert deepspeed.__ds__ == ds_engine.__version__
    assert "ds" in deepspeed.IMPLEMENTATION and "not DeepSpeed" in deepspeed.IMPLEMENTATION


@pytest.mark.parametrize(
    "requirement",
    [
        "deepspeed>=0.16.0",  # Lightning's DeepSpeedStrategy
        "deepspeed>=0.9.3",  # transformers' dependency table
        "deepspeed>=0.13.0",
    ],
)
def test_frameworks_version_requirements_admit_it(requirement: str):
    assert Requirement(requirement).specifier.contains(deepspeed.__version__, prereleases=True)


def test_distribution_metadata_matches_the_module():
    """transformers reads ``importlib.metadata.version("deepspeed")``: it must be this package's version."""
    metadata = importlib.import_module("importlib.metadata")
    try:
        installed = metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        pytest.skip("run from the source tree (not installed): no distribution metadata to compare")
    assert installed == deepspeed.__version__


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("deepspeed.runtime.lr_schedules", "VALID_LR_SCHEDULES"),
        ("deepspeed.launcher.runner", "DEEPSPEED_ENVIRONMENT_NAME"),
        ("deepspeed.utils.logging", "logger"),
        ("deepspeed.utils", "logger"),
        ("deepspeed.utils", "log_dist"),
        ("deepspeed.runtime.zero.partition_parameters", "zero_wrapper_for_fp_tensor_constructor"),
        ("deepspeed.runtime.zero.partition_parameters", "_orig_torch_arange"),
        ("deepspeed.runtime.zero", "GatheredParameters"),
        ("deepspeed.runtime.zero", "Init"),
        ("deepspeed.checkpoint.utils", "clone_tensors_for_torch_save"),
        ("deepspeed.accelerator", "get_accelerator"),
        ("deepspeed.comm", "get_rank"),
        ("deepspeed.ops.adam", "DeepSpeedCPUAdam"),
        ("deepspeed.ops.adam", "FusedAdam"),
        ("deepspeed.ops.adagrad", "DeepSpeedCPUAdagrad"),
        ("deepspeed.ops.lion", "DeepSpeedCPULion"),
        ("deepspeed", "DeepSpeedEngine"),
        ("deepspeed", "initialize"),
        ("deepspeed", "init_distributed"),
    ],
)
def test_module_paths_frameworks_import(path: str, name: str):
    assert hasattr(importlib.import_module(path), name)


def test_names_forward_to_the_one_implementation():
    assert deepspeed.DeepSpeedEngine is ds_engine.DeepSpeedEngine
    assert deepspeed.zero.Init is ds_engine.zero.Init
    assert deepspeed.comm.all_reduce is deepspeed.comm.comm.all_reduce
    assert deepspeed.initialize.__wrapped__ is ds_engine.initialize


def test_logger_is_a_real_logger_that_quiets_the_engine():
    from deepspeed.utils.logging import logger

    assert isinstance(logger, logging.Logger)
    assert logger is logging.getLogger("ds_engine")


@pytest.mark.parametrize(
    ("path", "name"),
    [("deepspeed.ops.adagrad", "DeepSpeedCPUAdagrad"), ("deepspeed.ops.lion", "DeepSpeedCPULion")],
)  # fmt: skip
def test_missing_features_fail_at_use_naming_them(path: str, name: str):
    cls = getattr(importlib.import_module(path), name)
    with pytest.raises(deepspeed.FeatureNotAvailableError, match="not available in ds"):
        cls([])


def test_unknown_name_says_where_ds_looked():
    with pytest.raises(AttributeError, match="ds maps deepspeed.utils onto .*deepspeed.utils._utils"):
        deepspeed.utils.no_such_name  # noqa: B018


@pytest.mark.parametrize(
    "dotted",
    [
        "runtime.lr_schedules.VALID_LR_SCHEDULES",  # Accelerate's _prepare_deepspeed, the Trainer through it
        "runtime.zero.partition_parameters",
        "launcher.runner.DEEPSPEED_ENVIRONMENT_NAME",  # accelerate launch
        "checkpoint.utils.clone_tensors_for_torch_save",
    ],
)
def test_submodules_are_reachable_as_attributes_after_import_deepspeed(dotted: str):
    """Frameworks write ``deepspeed.runtime.lr_schedules.X`` after a bare ``import deepspeed``."""
    value = deepspeed
    for part in dotted.split("."):
        value = getattr(value, part)
    assert value is not None
