"""DeepSpeed 0.19.8's answers where its own unit tests pin them, against ds's ``deepspeed``.

The record is ``fixtures/deepspeed_compat.json`` (``tools/fixtures/make_deepspeed_compat_fixtures.py``, run with
the real DeepSpeed): config keys beyond the reference (``gradient_allreduce_op``, ``data_types``,
``offload_optimizer.pipeline``), the deprecated-field rules, ``DeepSpeedFP16Config``'s validation, the
multi-host runners' constructors and commands, and the ``gradient_clipping`` getter.
"""

from __future__ import annotations

import json
import re
import sys
from copy import deepcopy
from pathlib import Path

import pytest
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.runtime.config_utils import DeepSpeedConfigModel
from deepspeed.runtime.precision_config import DeepSpeedFP16Config
from ds_config import ConfigError
from pydantic import Field, ValidationError

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_compat.json").read_text())
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools/fixtures"))
recorder = pytest.importorskip("make_deepspeed_compat_fixtures")

# attributes ds reads differently on purpose: DeepSpeed's defaults for keys the case does not set
_SKIP_ATTRS = {"zero_config.offload_optimizer.pipeline", "zero_config.offload_optimizer.pipeline_read"}


def _attr(obj, path):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


@pytest.mark.parametrize("name", sorted(recorder.CONFIGS))
def test_deepspeed_config_reads_as_deepspeed_0_19_8(name):
    want = RECORD["configs"][name]
    config = {"train_batch_size": 1, **deepcopy(recorder.CONFIGS[name])}
    if "error" in want:
        recorded = {"ValueError": ValueError, "AssertionError": AssertionError}[want["error"]["mro"][0]]
        with pytest.raises(recorded) as info:  # DeepSpeed's class; ds's ConfigError (a ValueError) as well
            DeepSpeedConfig(config)
        assert isinstance(info.value, ConfigError)
        if recorded is AssertionError:  # a deprecated key and its replacement together: both are named
            old, new = re.search(
                r"parameter '(\w+)' and replacing parameter '(\w+)'", want["error"]["message"]
            ).groups()
            assert old in str(info.value) and new in str(info.value)
        if (
            want["error"]["mro"][0] == "ValueError"
            and "gradient_allreduce_op='sum'" in want["error"]["message"]
        ):
            if "stage 3" in want["error"]["message"]:
                assert want["error"]["message"] in str(info.value)  # DeepSpeed's own words
            else:  # ds refuses ZenFlow / DeepCompile themselves, naming them
                assert "not supported by ds" in str(info.value)
        return
    cfg = DeepSpeedConfig(config)
    for path, value in want.items():
        if value == "<no attribute>":
            continue
        if path in _SKIP_ATTRS and "offload_optimizer" not in config.get("zero_optimization", {}):
            continue
        got = _attr(cfg, path)
        assert got == value, (path, got, value)


def test_offload_optimizer_pipeline_is_read_or_write():
    cfg = DeepSpeedConfig({"train_batch_size": 1, **recorder.CONFIGS["offload_optimizer.pipeline_read"]})
    assert cfg.zero_config.offload_optimizer.pipeline is True
    cfg = DeepSpeedConfig({"train_batch_size": 1, **recorder.CONFIGS["offload_optimizer.plain"]})
    assert cfg.zero_config.offload_optimizer.pipeline is False


def test_grad_accum_dtype_fp32_gives_bf16_training_an_fp32_accumulation():
    import ds_config

    cfg = ds_config.load_config(
        {"train_batch_size": 1, "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},
        world_size=1,
    )
    assert cfg.bf16.grad_accum_dtype == "fp32"  # what ds-zero and ds-engine read
    with pytest.raises(ds_config.ConfigError, match="unsupported mix"):
        ds_config.load_config(
            {"train_batch_size": 1, "fp16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},
            world_size=1,
        )


@pytest.mark.parametrize("name", sorted(recorder.FP16_CASES))
def test_fp16_config_accepts_and_refuses_as_deepspeed_0_19_8(name):
    want = RECORD["fp16_config"][name]
    if "error" in want:
        with pytest.raises(ValidationError) as info:
            DeepSpeedFP16Config(**recorder.FP16_CASES[name])
        first = want["error"]["message"].split("\n")[2].split("Value error, ")[-1].split(" [type")[0]
        assert first in str(info.value)
        return
    cfg = DeepSpeedFP16Config(**recorder.FP16_CASES[name])
    assert {f: getattr(cfg, f) for f in recorder.FP16_FIELDS} == want


def test_dynamic_scale_fields_are_checked_where_the_scaler_runs():
    import ds_config

    with pytest.raises(ds_config.ConfigError, match="loss_scale_window must be >= 1"):
        ds_config.load_config(
            {"train_batch_size": 1, "fp16": {"enabled": True, "loss_scale_window": 0}}, world_size=1
        )


class _Conf(DeepSpeedConfigModel):
    param_1: int = 0
    param_2_old: str | None = Field(
        None, json_schema_extra={"deprecated": True, "new_param": "param_2", "new_param_fn": lambda x: [x]}
    )
    param_2: list[str] | None = None
    param_3: int = Field(0, alias="param_3_alias")


class _Inner(DeepSpeedConfigModel):
    new: int = 0


class _Outer(DeepSpeedConfigModel):
    inner: _Inner = _Inner()
    old: int | None = Field(None, json_schema_extra={"deprecated": True, "new_param": "inner.new"})


_DEPRECATED = {
    "old": lambda: _Conf(param_2_old="DS").param_2,
    "both": lambda: _Conf(param_2=["DS"], param_2_old="DS").param_2,
    "alias": lambda: _Conf(param_3_alias=10).param_3,
    "name": lambda: _Conf(param_3=10).param_3,
    "typo": lambda: _Conf(param_1_typo=0),
    "nested.old": lambda: _Outer(old=3).inner.new,
    "nested.both": lambda: _Outer(old=3, inner={"new": 4}).inner.new,
}


@pytest.mark.parametrize("name", sorted(_DEPRECATED))
def test_deprecated_field_rules_as_deepspeed_0_19_8(name):
    want = RECORD["deprecated_rules"][name]
    if isinstance(want, dict) and "error" in want:
        cls = {"AssertionError": AssertionError, "ValidationError": ValidationError}[want["error"]["mro"][0]]
        with pytest.raises(cls) as info:
            _DEPRECATED[name]()
        message = want["error"]["message"]
        if cls is AssertionError:
            assert message in str(info.value)
        else:  # the same pydantic error on the same field
            assert message.split("\n")[1] in str(info.value)
        return
    assert _DEPRECATED[name]() == want
