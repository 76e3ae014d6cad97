"""``zero_optimization.leaf_module`` (DeepSpeed 0.19.8's section): the same parse as DeepSpeed for the values
tools/fixtures/record_deepspeed_config_keys.py recorded (its ``answers``), and the defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ds_config import DEFAULT_LEAF_MODULE_CLASSES, ConfigError, load_config

RECORD = Path(__file__).resolve().parents[2] / "deepspeed/tests/fixtures/deepspeed_0.19.8_surface.json"
CASES = json.loads(RECORD.read_text())["config_keys"]["answers"]["zero_optimization.leaf_module"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: json.dumps(c["value"]))
def test_parsed_as_deepspeed_parses_it(case):
    config = {"train_batch_size": 1, "zero_optimization": {"stage": 3, "leaf_module": case["value"]}}
    if "error" in case:
        with pytest.raises(ConfigError, match=r"zero_optimization\.leaf_module"):
            load_config(config)
        return
    section = load_config(config).zero_optimization.leaf_module
    assert section.model_dump() == case["parsed"]


def test_defaults_are_hugging_faces_sparse_moe_blocks_at_every_stage():
    assert list(DEFAULT_LEAF_MODULE_CLASSES) == CASES[0]["parsed"]["classes"]
    for zero in ({}, {"stage": 2}):
        section = load_config(
            {"train_batch_size": 1, "zero_optimization": zero}
        ).zero_optimization.leaf_module
        assert section.classes == list(DEFAULT_LEAF_MODULE_CLASSES) and section.names == []
