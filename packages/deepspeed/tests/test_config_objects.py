"""DeepSpeedConfig and its section models, read as code reads them, against DeepSpeed 0.19.8's record.

The record is ``fixtures/deepspeed_config_objects.json``, written by
``env -u PYTHONPATH DS_ACCELERATOR=cpu $DS_DEEPSPEED_PYTHON tools/fixtures/make_deepspeed_behaviour_fixtures.py``
(``tools/fixtures/_record_deepspeed_surface.py`` holds the configs). Every value DeepSpeed has must be ds's too,
except the differences listed in ``DIFFERENCES`` with their reason; each listed difference must really be
one, so the list cannot go stale.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from deepspeed.runtime import config as ds_config_mod
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig, get_zero_config
from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools" / "fixtures"))
import _record_deepspeed_surface as surface  # noqa: E402 - the same configs DeepSpeed read

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_config_objects.json").read_text())

# (section, attribute) -> why ds's value differs from DeepSpeed 0.19.8's
DIFFERENCES = {
    ("top", "steps_per_print"): "DeepSpeed's default None never prints; ds prints every 10 steps",
    (
        "zero",
        "contiguous_gradients",
    ): "ds's default false (the config reference's); DeepSpeed 0.19.8's model true",
    ("zero", "cpu_offload"): "a deprecated bool in ds_config (false when absent); DeepSpeed keeps None",
    ("offload_optimizer", "pin_memory"): "ds's default false (pageable CPU memory); DeepSpeed's true",
    (
        "offload_param",
        "pin_memory",
    ): "no effect in ds (config reference's NO_EFFECT); DeepSpeed's default true",
    ("offload_param", "ratio"): "DeepSpeed's offload_param has no ratio either (read as missing there)",
}


def _reads(cfg) -> dict:
    return surface._section_reads(cfg)


def _compare(name: str, ours: dict, theirs: dict, seen: set) -> list[str]:
    problems = []
    for section, values in theirs.items():
        if not isinstance(values, dict):
            continue
        for attr, value in values.items():
            if isinstance(value, dict) and "missing" in value:
                continue  # DeepSpeed has no such attribute either
            got = (ours.get(section) or {}).get(attr)
            if isinstance(value, float) and isinstance(got, float) and math.isclose(value, got):
                continue
            if got != value:
                if (section, attr) in DIFFERENCES:
                    seen.add((section, attr))
                    continue
                problems.append(f"{name}: {section}.{attr} is {got!r}, DeepSpeed's {value!r}")
    return problems


def test_deepspeed_config_reads_as_deepspeeds():
    problems: list[str] = []
    seen: set = set()
    for name, config in surface.CONFIGS.items():
        recorded = RECORD["configs"][name]
        assert "refused" not in recorded, recorded
        ours = _reads(ds_config_mod.DeepSpeedConfig(json.loads(json.dumps(config))))
        assert ours["zero_type"] == recorded["zero_type"] == "DeepSpeedZeroConfig"
        assert ours["fp16_type"] == recorded["fp16_type"] == "DeepSpeedFP16Config"
        problems += _compare(name, ours, recorded, seen)
    assert problems == []
    stale = set(DIFFERENCES) - seen - {("offload_param", "ratio")}
    assert stale == set(), f"listed as different but equal now: {stale}"


@pytest.mark.parametrize("name", [n for n in surface.BAD_CONFIGS if n.startswith("loss_scale.")])
def test_loss_scale_is_refused_with_deepspeeds_message(name):
    recorded = RECORD["errors"][name]
    with pytest.raises(ValueError) as raised:  # DeepSpeed's is pydantic's ValidationError, a ValueError
        ds_config_mod.DeepSpeedConfig(surface.BAD_CONFIGS[name])
    deepspeeds = recorded["message"].split("Value error, ", 1)[1].split(" [type=", 1)[0]
    assert deepspeeds in str(raised.value)


@pytest.mark.parametrize(
    "name", ["allreduce_op.bad", "gather_fp16_and_16bit", "fp16_and_bf16", "allreduce_op.sum_stage3"]
)
def test_configs_deepspeed_refuses_are_refused(name):
    assert RECORD["errors"][name] is not None
    with pytest.raises((ValueError, AssertionError)):
        ds_config_mod.DeepSpeedConfig(surface.BAD_CONFIGS[name])


def test_an_hjson_file(tmp_path):
    path = tmp_path / "ds_config.hjson"
    path.write_text(
        "{\n  # hjson comment\n  train_batch_size: 8\n  zero_optimization: {stage: 2,}\n"
        "  gradient_clipping: 0.25\n}\n"
    )
    cfg = ds_config_mod.DeepSpeedConfig(str(path))
    got = {"train_batch_size": cfg.train_batch_size, "stage": cfg.zero_optimization_stage}
    got["gradient_clipping"] = cfg.gradient_clipping
    assert got == RECORD["hjson"]


def test_an_hjson_file_trains_under_initialize(tmp_path):
    import deepspeed
    import torch

    path = tmp_path / "ds_config.hjson"
    path.write_text(
        '{\n  // comment\n  train_batch_size: 2\n  optimizer: {"type": "SGD", "params": {lr: 0.1}}\n}\n'
    )
    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(2, 1), config=str(path))
    assert engine.train_batch_size() == 2 and engine.gradient_clipping() == 1.0


def test_zero_section_built_directly():
    recorded = RECORD["zero_direct"]
    z = DeepSpeedZeroConfig(stage=3, stage3_prefetch_bucket_size=11, stage3_max_live_parameters=12)
    seen: set = set()
    assert (
        _compare(
            "alias", {"zero": surface._read(z, surface.ZERO_ATTRIBUTES)}, {"zero": recorded["alias"]}, seen
        )
        == []
    )
    z2 = DeepSpeedZeroConfig(stage=3, prefetch_bucket_size=21)
    assert surface._read(z2, ("prefetch_bucket_size", "overlap_comm")) == recorded["field_name"]
    assert DeepSpeedZeroConfig().overlap_comm == recorded["default_stage0_overlap"]
    for case in ("bad_stage", "unknown_key"):
        assert recorded[case] is not None
    with pytest.raises(ValueError):
        DeepSpeedZeroConfig(stage=7)
    with pytest.raises(ValueError):
        DeepSpeedZeroConfig(stage=1, no_such_key=1)


def test_offload_section_built_directly():
    recorded = RECORD["offload_direct"]
    ours = surface._read(
        DeepSpeedZeroOffloadOptimizerConfig(device="cpu", ratio=0.5), surface.OFFLOAD_ATTRIBUTES
    )
    differ = {k for k in ours if ours[k] != recorded[k]}
    assert differ == {"pin_memory"}  # DIFFERENCES: ds's default false


def test_get_functions_read_a_raw_dict_as_deepspeeds():
    for fn_name, recorded in RECORD["getters"].items():
        fn = getattr(ds_config_mod, fn_name)
        for case, params in (("full", surface.CONFIGS["full"]), ("empty", {})):
            got = surface.jsonable(fn(dict(params)))
            if fn_name == "get_steps_per_print" and case == "empty":
                assert recorded[case] is None and got == 10  # DIFFERENCES: ds prints every 10 steps
                continue
            assert got == recorded[case], (fn_name, case)


def test_zero_config_getter_applies_deepspeeds_stage3_default():
    assert get_zero_config({"zero_optimization": {"stage": 3}}).overlap_comm is True
    assert get_zero_config({"zero_optimization": {"stage": 2}}).overlap_comm is False


def test_config_model_base_moves_a_deprecated_field_onto_its_replacement(caplog):
    """DeepSpeedConfigModel (runtime.config_utils), the base libraries derive their own config models from."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel
    from pydantic import Field

    class Example(DeepSpeedConfigModel):
        new_size: int = 0
        old_size: str = Field(
            "0", json_schema_extra={"deprecated": True, "new_param": "new_size", "new_param_fn": int}
        )

    assert Example(old_size="12").new_size == 12
    assert "old_size is deprecated use new_size instead" in caplog.text
    assert Example(new_size="auto").new_size == 0  # Hugging Face's "auto" leaves the default
    with pytest.raises(ValueError, match="together"):
        Example(old_size="1", new_size=2)
    with pytest.raises(ValueError):
        Example(unknown=1)
