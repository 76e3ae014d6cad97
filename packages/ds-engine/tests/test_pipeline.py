"""The pipeline engine: DeepSpeed's PipelineModule trained by train_batch on real gloo ranks gives the
losses of the same model without a pipeline (fp32, 1e-5 relative)."""

from __future__ import annotations

import pytest
from _pipe_workers import reference_losses, train
from rank_testing import spawn

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 0.05,  # small enough to clip every step: the norm must span both stages
    "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
}
STEPS = 3


@pytest.mark.parametrize("world,stages", [(2, 2), (4, 2)], ids=["2stages", "2stages_x_2dp"])
def test_losses_equal_the_model_without_a_pipeline(world, stages):
    results = spawn(train, world, stages, CONFIG, STEPS)
    expected = reference_losses(CONFIG, STEPS, dp=world // stages)
    for r in results:  # every stage returns the loss, as DeepSpeed's engine does
        assert r["losses"] == pytest.approx(expected, rel=1e-5)
    assert [r["stage"] for r in results] == [s for s in range(stages) for _ in range(world // stages)]
    assert results[0]["first"] and results[-1]["last"] and not results[0]["last"]


def test_activation_checkpoint_interval_key_recomputes_the_layers():
    from _pipe_workers import checkpoint_interval_calls

    base = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": CONFIG["optimizer"],
    }
    plain, checkpointed = (
        spawn(checkpoint_interval_calls, 1, base)[0],
        spawn(checkpoint_interval_calls, 1, {**base, "pipeline": {"activation_checkpoint_interval": 1}})[0],
    )
    assert plain == 2 * 2  # two blocks, two micro-batches
    assert checkpointed == 2 * plain  # each block's forward runs again in backward


def test_zero_2_and_3_are_refused_as_deepspeed_refuses_them():
    from _pipe_workers import refusals

    for r in spawn(refusals, 2):
        for stage in (2, 3):
            assert r[stage] == (
                "AssertionError",
                "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
            )
        kind, message = r["bf16_fp32_accum"]  # FeatureNotAvailableError, a NotImplementedError
        assert kind == "NotImplementedError" and "TiedLayerSpec keys ['embed']" in message


def test_checkpoint_resumes_at_the_same_degree_and_loads_weights_at_another(tmp_path):
    from _pipe_workers import checkpoint_roundtrip

    for r in spawn(checkpoint_roundtrip, 2, 2, str(tmp_path / "same"), 2):
        assert r["again"] == pytest.approx(r["after"], rel=1e-6)  # weights, Adam moments, counters
        assert r["client"] == {"note": "kept"}
    files = sorted(p.name for p in (tmp_path / "same" / "t").glob("layer_*"))
    assert files == [f"layer_{i:02d}-model_states.safetensors" for i in range(5)]  # the head holds no weights
    # the same checkpoint as the plain model (one stage, 2 data-parallel ranks): the weights load, the
    # first loss is the one the 2-stage run saw; its optimizer state is refused, naming the degrees
    for r in spawn(checkpoint_roundtrip, 2, 2, str(tmp_path / "other"), 1):
        assert r["eval"] == pytest.approx(r["after"][0], rel=1e-5)
        assert "saved at 2 pipeline stages" in r["error"] and "load_optimizer_states=False" in r["error"]


def test_fp16_and_bf16_train_across_stages():
    """Loss scaling spans the stages (the last stage scales, the others step on the scaled gradients and
    agree on overflow); both precisions follow the fp32 curve within their rounding."""
    from _pipe_workers import train_each

    configs = [
        {**CONFIG, "bf16": {"enabled": True}},
        {**CONFIG, "fp16": {"enabled": True, "initial_scale_power": 12}},
    ]
    expected = reference_losses(CONFIG, STEPS, dp=1)
    results = spawn(train_each, 2, 2, configs, STEPS)
    assert results[0] == results[1]  # every stage returns the same losses
    for losses in results[0]:
        assert losses == pytest.approx(expected, rel=3e-2)
