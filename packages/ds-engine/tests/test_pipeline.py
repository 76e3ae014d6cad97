"""The pipeline engine: DeepSpeed's PipelineModule trained by train_batch on real gloo ranks gives the
losses of the same model without a pipeline (fp32, 1e-5 relative), with ZeRO-1 those of the plain model's
ZeRO-1, and the features around it (precisions, monitors, checkpoints, refusals) work across stages.

Each rank start costs seconds of imports on a loaded machine, so one 2-rank job and one 4-rank job run
everything (``_pipe_workers.two_ranks`` / ``four_ranks``), once per module; each test reads its part.
"""

from __future__ import annotations

import csv

import pytest
from _pipe_workers import four_ranks, reference_losses, two_ranks
from rank_testing import spawn

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 0.05,  # small enough to clip every step: the norm must span both stages
    "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
}
STEPS = 3


@pytest.fixture(scope="module")
def at2(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe2")
    results = spawn(two_ranks, 2, str(root), CONFIG, STEPS)
    return results, root


@pytest.fixture(scope="module")
def at4():
    return spawn(four_ranks, 4, CONFIG, STEPS)


def test_losses_equal_the_model_without_a_pipeline_at_2_stages(at2):
    results, _ = at2
    expected = reference_losses(CONFIG, STEPS, dp=1)
    for r in results:  # every stage returns the loss, as DeepSpeed's engine does
        assert r["fp32"]["losses"] == pytest.approx(expected, rel=1e-5)
    assert [r["fp32"]["stage"] for r in results] == [0, 1]
    assert results[0]["fp32"]["first"] and results[-1]["fp32"]["last"] and not results[0]["fp32"]["last"]


def test_losses_equal_the_model_without_a_pipeline_at_2_stages_x_2_data_parallel(at4):
    expected = reference_losses(CONFIG, STEPS, dp=2)
    for r in at4:
        assert r["fp32"]["losses"] == pytest.approx(expected, rel=1e-5)
    assert [r["fp32"]["stage"] for r in at4] == [0, 0, 1, 1]


def test_zero_1_across_each_stage_s_data_parallel_ranks_equals_the_plain_model_s_zero_1(at4):
    """ZeRO-1 at 2 stages x 2 data-parallel ranks (each stage's optimizer state sharded over its 2 ranks)
    against the model without a pipeline under ZeRO-1 over all 4 ranks, the same micro-batches per step."""
    plain = at4[0]["plain_zero1"]
    assert all(r["plain_zero1"] == plain for r in at4)
    for r in at4:
        assert r["zero1"]["losses"] == pytest.approx(plain, rel=1e-5)
    assert plain == pytest.approx(reference_losses(CONFIG, STEPS, dp=2), rel=1e-5)


def test_steps_per_print_and_the_monitor_report_the_loss_train_batch_returns(at2):
    results, root = at2
    losses = results[0]["fp32"]["losses"]
    printed = [ln for ln in results[0]["fp32"]["printed"].splitlines() if ln.startswith("steps: ")]
    assert [
        ln.split(" iter time")[0] for ln in printed
    ] == [  # DeepSpeed's line, every step (steps_per_print 1)
        f"steps: {i + 1} loss: {loss:0.4f}" for i, loss in enumerate(losses)
    ]
    assert "steps: " not in results[1]["fp32"]["printed"]  # the first rank prints it, as DeepSpeed's does
    with open(root / "monitor" / "pipe" / "Train_Samples_train_loss.csv") as f:
        rows = list(csv.reader(f))[1:]
    assert [int(step) for step, _ in rows] == [8, 16, 24]  # global samples: 8 a batch
    assert [float(v) for _, v in rows] == pytest.approx(losses, rel=1e-7)


def test_activation_checkpoint_interval_key_recomputes_the_layers(at2):
    results, _ = at2
    for plain, checkpointed in (r["act_ckpt"] for r in results):
        assert plain == 2 * 2  # two blocks, two micro-batches
        assert checkpointed == 2 * plain  # each block's forward runs again in backward


def test_zero_2_and_3_are_refused_as_deepspeed_refuses_them(at2):
    results, _ = at2
    for r in (r["refusals"] for r in results):
        for stage in (2, 3):
            assert r[stage] == (
                "AssertionError",
                "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
            )
        kind, message = r["bf16_fp32_accum"]  # FeatureNotAvailableError, a NotImplementedError
        assert kind == "NotImplementedError" and "TiedLayerSpec keys ['embed']" in message


def test_checkpoint_resumes_at_the_same_degree_and_loads_weights_at_another(at2):
    results, root = at2
    for r in (r["checkpoint_same"] for r in results):
        assert r["again"] == pytest.approx(r["after"], rel=1e-6)  # weights, Adam moments, counters
        assert r["client"] == {"note": "kept"}
    files = sorted(p.name for p in (root / "same" / "t").glob("layer_*"))
    assert files == [f"layer_{i:02d}-model_states.safetensors" for i in range(5)]  # the head holds no weights
    # the same checkpoint as the plain model (one stage, 2 data-parallel ranks): the weights load, the
    # first loss is the one the 2-stage run saw; its optimizer state is refused, naming the degrees
    for r in (r["checkpoint_other"] for r in results):
        assert r["eval"] == pytest.approx(r["after"][0], rel=1e-5)
        assert "saved at 2 pipeline stages" in r["error"] and "load_optimizer_states=False" in r["error"]


def test_fp16_and_bf16_train_across_stages(at2):
    """Loss scaling spans the stages (the last stage scales, the others step on the scaled gradients and
    agree on overflow); both precisions follow the fp32 curve within their rounding."""
    results, _ = at2
    expected = reference_losses(CONFIG, STEPS, dp=1)
    for precision in ("bf16", "fp16"):
        assert results[0][precision] == results[1][precision]  # every stage returns the same losses
        assert results[0][precision] == pytest.approx(expected, rel=3e-2)
