"""DeepSpeed 0.19.8's other spellings of keys (field names, deprecated keys), gradient_allreduce_op, pipeline,
and its messages for a bad fp16.loss_scale (the values come from DeepSpeed's record, in the deepspeed
package's fixtures: packages/deepspeed/tests/test_config_objects.py compares them with DeepSpeed)."""

from __future__ import annotations

import math
import pickle

import pytest
from ds_config import ConfigError, DeprecatedKeyConflictError, load_config


def _load(**config):
    return load_config({"train_batch_size": 2, **config})


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("prefetch_bucket_size", "stage3_prefetch_bucket_size"),
        ("param_persistence_threshold", "stage3_param_persistence_threshold"),
        ("max_live_parameters", "stage3_max_live_parameters"),
        ("max_reuse_distance", "stage3_max_reuse_distance"),
    ],
)
def test_zero_field_names_read_as_their_keys(name, key):
    cfg = _load(zero_optimization={"stage": 3, name: 1234})
    assert getattr(cfg.zero_optimization, key) == 1234


def test_gather_16bit_field_name():
    cfg = _load(zero_optimization={"stage": 3, "gather_16bit_weights_on_model_save": True})
    assert cfg.zero_optimization.stage3_gather_16bit_weights_on_model_save is True


def test_both_spellings_of_one_key_is_an_error():
    with pytest.raises(ConfigError, match="another name for 'zero_optimization.stage3_prefetch_bucket_size'"):
        _load(zero_optimization={"stage": 3, "prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2})


def test_deprecated_cpu_offload_param_offloads_the_parameters():
    cfg = _load(zero_optimization={"stage": 3, "cpu_offload_param": True})
    assert cfg.zero_optimization.offload_param.device == "cpu"
    with pytest.raises(ConfigError, match="cpu_offload_param.*together"):
        _load(zero_optimization={"stage": 3, "cpu_offload_param": True, "offload_param": {"device": "cpu"}})


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            {"stage3_gather_fp16_weights_on_model_save": True},
            {"stage3_gather_16bit_weights_on_model_save": True},
        ),
        ({"cpu_offload": True}, {"offload_optimizer": {"device": "cpu"}}),
        ({"cpu_offload_param": True}, {"offload_param": {"device": "cpu"}}),
    ],
)
def test_a_deprecated_key_with_its_replacement_is_an_assertion_error_as_in_deepspeed(old, new):
    # DeepSpeed 0.19.8 raises AssertionError here; ds's error is that and a ConfigError (a ValueError)
    with pytest.raises(AssertionError) as info:
        _load(zero_optimization={"stage": 3, **old, **new})
    error = info.value
    assert isinstance(error, DeprecatedKeyConflictError) and isinstance(error, ConfigError)
    assert [next(iter(old)) in str(error), error.problems[0].deprecated_with_replacement] == [True, True]
    again = pickle.loads(pickle.dumps(error))  # a rank can send it to another, the class kept
    assert type(again) is DeprecatedKeyConflictError and again.problems == error.problems


def test_other_config_errors_are_not_assertion_errors():
    with pytest.raises(ConfigError) as info:
        _load(zero_optimization={"stage": 3, "cpu_offload_param": True, "offload_param": {"device": "gpu"}})
    assert not isinstance(info.value, AssertionError)


def test_old_bfloat16_section_name():
    assert _load(bfloat16={"enabled": True}).bf16.enabled


@pytest.mark.parametrize("op", ["mean", "MEAN"])
def test_gradient_allreduce_op_mean(op):
    assert _load(gradient_allreduce_op=op).gradient_allreduce_op == "mean"


def test_pipeline_section_loads():
    assert _load(pipeline={"stages": "auto", "partition": "uniform"}).pipeline.partition == "uniform"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "fp16.loss_scale must be a number, not bool"),
        ("x", "fp16.loss_scale must be a number"),
        (math.inf, "fp16.loss_scale must be a finite number (not inf/-inf/nan)"),
        (math.nan, "fp16.loss_scale must be a finite number (not inf/-inf/nan)"),
        (-1, "fp16.loss_scale must be >= 0 (0 enables dynamic loss scaling)"),
    ],
)
def test_loss_scale_errors_carry_deepspeeds_messages(value, message):
    with pytest.raises(ConfigError) as raised:
        _load(fp16={"enabled": True, "loss_scale": value})
    assert str(raised.value).rstrip().endswith(message)
