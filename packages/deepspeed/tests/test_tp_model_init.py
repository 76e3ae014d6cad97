"""deepspeed.tp_model_init (what the Trainer calls when autotp_size > 1): records the degree, which the next
initialize() merges into the config as DeepSpeed 0.19.8 does (the config wins; a different value is an error)."""

from __future__ import annotations

import deepspeed
import pytest
import torch


@pytest.fixture(autouse=True)
def _forget():
    yield
    deepspeed._tp_model_init_args.clear()


def test_returns_the_model_unchanged_and_fills_a_config_without_the_key():
    model = torch.nn.Linear(2, 2)
    assert deepspeed.tp_model_init(model, tp_size=2, dtype=torch.bfloat16) is model
    assert model.weight.shape == (2, 2)
    merged = deepspeed._with_tp_model_init({"train_batch_size": 4})
    assert merged["tensor_parallel"] == {"autotp_size": 2}
    assert (
        deepspeed._with_tp_model_init({"tensor_parallel": {"autotp_size": 2}})["tensor_parallel"][
            "autotp_size"
        ]
        == 2
    )


def test_a_different_config_degree_is_deepspeeds_error():
    deepspeed.tp_model_init(torch.nn.Linear(2, 2), tp_size=2, dtype=torch.float32)
    with pytest.raises(
        ValueError, match=r"Conflicting tensor_parallel.autotp_size in config \(4\) and tp_model_init \(2\)"
    ):
        deepspeed._with_tp_model_init({"tensor_parallel": {"autotp_size": 4}})


def test_nothing_recorded_leaves_the_config_alone():
    raw = {"train_batch_size": 4}
    assert deepspeed._with_tp_model_init(raw) is raw
