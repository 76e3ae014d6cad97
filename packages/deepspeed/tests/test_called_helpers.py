"""DeepSpeed's config helpers, logging and runtime utilities, the tensor-constructor wrapper and the launcher's
process-tree teardown, called as DeepSpeed 0.19.8 was for ``fixtures/deepspeed_called.json``
(``tools/fixtures/make_deepspeed_called_fixtures.py``; the cases are ``tools/fixtures/deepspeed_called_cases.py``,
run here under ds). Where ds answers differently on purpose, ``KNOWN`` says why, and the test fails once it
no longer differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_called.json").read_text())
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools/fixtures"))
import deepspeed_called_cases as cases  # noqa: E402

KNOWN = {
    "config_utils_getters/get_config_default/overlap_comm": (
        "DeepSpeed's field defaults to None and a validator makes it true at stage 3; ds's field defaults to "
        "false and get_zero_config gives stage 3 DeepSpeed's true"
    ),
    "precision_and_offload_sections/DeepSpeedZeroOffloadParamConfig/cpu/pin_memory": (
        "offload_param.pin_memory has no effect in ds (docs/config-reference.md): ds's default false"
    ),
    "precision_and_offload_sections/DeepSpeedZeroOffloadParamConfig/defaults/pin_memory": (
        "offload_param.pin_memory has no effect in ds (docs/config-reference.md): ds's default false"
    ),
    "lr_schedules/WarmupCosineLR/state_dict": (
        "ds's state also holds the base learning rates (org_lrs), so that a resumed schedule keeps them; "
        "DeepSpeed's holds the iteration only (ds loads either)"
    ),
    "precision_and_offload_sections/get_bfloat16_config/unknown key": (
        "ds_config's ConfigError naming the key, a ValueError as pydantic's ValidationError is (checked below)"
    ),
}


@pytest.mark.parametrize("name", list(cases.SINGLE))
def test_answers_as_deepspeed(name, tmp_path):
    got = json.loads(json.dumps(cases.SINGLE[name](str(tmp_path))))
    known = {k: v for k, v in KNOWN.items() if k.startswith(f"{name}/")}
    differing: set[str] = set()
    assert cases.compare(RECORD["single"][name], got, name, known, differing) == []
    assert differing == set(known), f"no longer different: {set(known) - differing}"
    if name == "precision_and_offload_sections":
        raised = got["get_bfloat16_config"]["unknown key"]
        assert "ValueError" in raised["raises"] and "bf16.no_such" in raised["message"]


@pytest.fixture
def activation_state():
    """This test configures activation checkpointing process-wide: put the unconfigured state back after."""
    from ds_checkpoint.activation import _state

    saved = _state._RUNTIME
    _state._RUNTIME = _state._Runtime()
    yield
    _state._RUNTIME = saved


def test_activation_reset_releases_the_contiguous_buffers(activation_state):
    """DeepSpeed's ``checkpointing.reset``: after forward passes with no backward (evaluation with gradients on),
    the contiguous buffers are used up until reset. Not compared with DeepSpeed, whose contiguous path fails on
    CPU (``linear`` gets a 0-d weight)."""
    from deepspeed.runtime.activation_checkpointing import checkpointing as ckpt
    from ds_checkpoint.activation import CheckpointBuffersExhaustedError

    assert not ckpt.is_configured()
    ckpt.configure(None, partition_activations=True, contiguous_checkpointing=True, num_checkpoints=1)
    assert ckpt.is_configured()
    layer, x = torch.nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    ckpt.checkpoint(layer, x)
    with pytest.raises(CheckpointBuffersExhaustedError, match="reset"):
        ckpt.checkpoint(layer, x)
    ckpt.reset()
    ckpt.checkpoint(layer, x).sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(2, 4))
