"""AutoTP checkpoints (real gloo ranks): ``save_checkpoint`` at tensor-parallel degree 2 writes the whole
parameters and their optimizer state, and ``load_checkpoint`` resumes them at another degree, data-parallel
size, ZeRO stage and world size, continuing as the uninterrupted run does; the saved weights load into the
unsplit model. One 4-rank run saves (tp 2 x dp 2, ZeRO 2), one 2-rank run resumes in a chain
(_autotp_ckpt_workers.resume_chain). The Hugging Face Llama's whole weights are integration/frameworks'."""

from __future__ import annotations

import _autotp_ckpt_workers as w
import pytest
from rank_testing import spawn

REL = 1e-5  # fp32


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("autotp_ckpt"))
    saved = spawn(w.save_tp2_dp2, 4, root, timeout_s=600)
    resumed = spawn(w.resume_chain, 2, root, timeout_s=600)
    return saved[0], resumed[0], root


@pytest.mark.parametrize("case", ["tp2_from_tp2dp2", "tp1_from_tp2", "tp2_from_tp1"])
def test_resumed_runs_continue_as_the_uninterrupted_one(runs, case):
    saved, resumed, _ = runs
    got = resumed[case]
    assert saved["q_rows"] == 16 and got["q_rows"] == (32 if case.startswith("tp1") else 16)
    assert got["steps"] == 4
    assert got["rest"] == pytest.approx(saved["rest"], rel=REL), (case, got["rest"], saved["rest"])


def test_saved_weights_load_into_the_unsplit_model(runs):
    import safetensors.torch
    import torch

    _, resumed, root = runs
    ids = w.batch(9)
    for weights in (
        safetensors.torch.load_file(f"{root}/end/model.safetensors"),
        torch.load(f"{root}/16bit/pytorch_model.bin", weights_only=True),
    ):
        model = w.tiny_llama()
        model.load_state_dict(weights, strict=True)
        with torch.no_grad():
            loss = model(ids).item()
        assert loss == pytest.approx(resumed["eval_loss"], rel=REL)


def test_autotp_checkpoints_at_zero_stage_3_are_refused_by_name():
    import types

    from ds_engine import DeepSpeedEngine
    from ds_engine._missing import FeatureNotAvailableError
    from torch import nn

    split = nn.Linear(2, 2)
    split.ds_tp_group = object()  # what ds_tpsp.tensor.shard_model marks a split model with
    for stage, refused in ((2, False), (3, True)):
        engine = types.SimpleNamespace(module=split, zero_optimization_stage=lambda stage=stage: stage)
        if refused:
            with pytest.raises(
                FeatureNotAvailableError, match="save_checkpoint.*autotp_size > 1 at ZeRO stage 3"
            ):
                DeepSpeedEngine._tensor_parallel_group(engine, "save_checkpoint")
        else:
            assert DeepSpeedEngine._tensor_parallel_group(engine, "save_checkpoint") is split.ds_tp_group
