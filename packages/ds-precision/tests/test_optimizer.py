"""MixedPrecisionOptimizer: fp16/bf16 match fp32, skipped steps, clipping, accumulation, diagnostics."""

import logging
import math

import pytest
import torch
from _dsp_helpers import (
    assert_same_state,
    batches,
    loss_fn,
    make_model,
    make_wrapped,
    master_state,
    train,
)
from ds_precision import (
    DynamicLossScaler,
    MixedPrecisionOptimizer,
    OverflowAtMinimumScaleError,
    StaticLossScaler,
)
from rank_testing import live_storage_bytes

# Stated tolerance: after 40 AdamW steps, the weights of a low-precision run differ from the fp32 run
# by at most this relative L2 distance (measured: bf16 ~2e-3, fp16 ~3e-4).
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3}


def flat_weights(model):
    return torch.cat([p.detach().float().flatten() for p in model.parameters()])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_training_matches_fp32(dtype):
    data = batches(40)
    ref_model, ref_opt = make_wrapped(torch.float32)
    train(ref_model, ref_opt, data, torch.float32)
    model, opt = make_wrapped(dtype)
    applied = train(model, opt, data, dtype)
    assert all(applied)
    w, w32 = flat_weights(model), flat_weights(ref_model)
    assert ((w - w32).norm() / w32.norm()).item() < TOLERANCE[dtype]
    # master weights are fp32 and the model holds their rounding
    assert all(p.dtype == dtype for p in model.parameters())
    assert torch.equal(opt.groups[0].flat_master.to(dtype).float(), w)


def test_fp32_wrapper_is_bit_identical_to_plain_torch():
    data = batches(10)
    plain = make_model()
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.01)
    for b in data:
        loss_fn(plain, b, torch.float32).backward()
        plain_opt.step()
        plain_opt.zero_grad()
    model, opt = make_wrapped(torch.float32)
    train(model, opt, data, torch.float32)
    assert torch.equal(flat_weights(model), flat_weights(plain))
    # fp32 aliases: the model's parameters are views of the flat master buffer, no copies
    p0 = next(model.parameters())
    assert p0.data_ptr() == opt.groups[0].flat_master.data_ptr()


def _inject(value, steps, name="fc1.weight"):
    def inject(step, model):
        if step in steps:
            dict(model.named_parameters())[name].grad.view(-1)[-1] = value

    return inject


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_injected_overflow_skips_exactly_that_step_and_touches_nothing(value):
    data = batches(6)
    model, opt = make_wrapped(torch.float16)
    train(model, opt, data[:3], torch.float16)
    before = master_state(opt)
    weights = flat_weights(model)
    scale, hyst = opt.loss_scale, opt.scaler.cur_hysteresis
    opt.backward(loss_fn(model, data[3], torch.float16))
    _inject(value, {0})(0, model)
    assert opt.step() is False
    assert opt.overflow and opt.skipped_steps == 1 and opt.global_steps == 4
    assert_same_state(master_state(opt), before)
    assert torch.equal(flat_weights(model), weights)
    assert all(p.grad is None for p in model.parameters())  # the overflowed grads are discarded
    assert (opt.loss_scale, opt.scaler.cur_hysteresis) == (scale, hyst - 1)
    assert train(model, opt, data[4:], torch.float16) == [True, True]


def test_skipped_steps_are_exactly_the_corrupted_ones():
    # without loss scaling, skipping batches 2 and 5 must equal never having seen them
    data = batches(8)
    model, opt = make_wrapped(torch.bfloat16)
    applied = train(model, opt, data, torch.bfloat16, inject=_inject(math.nan, {2, 5}, "fc2.bias"))
    assert applied == [True, True, False, True, True, False, True, True]
    ref_model, ref_opt = make_wrapped(torch.bfloat16)
    train(ref_model, ref_opt, [b for i, b in enumerate(data) if i not in (2, 5)], torch.bfloat16)
    assert torch.equal(flat_weights(model), flat_weights(ref_model))
    assert_same_state(master_state(opt), master_state(ref_opt))


def test_unscale_and_clip_follow_the_spec_formula():
    model = make_model()
    opt = MixedPrecisionOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        scaler=StaticLossScaler(64.0),
        dtype=torch.float32,
        clip_grad=0.05,
    )
    ref = make_model()
    loss_fn(ref, batches(1)[0], torch.float32).backward()
    grads = torch.cat([p.grad.flatten() for p in ref.parameters()])
    norm = grads.norm().item()
    assert norm > 0.05  # clipping is active
    before = flat_weights(model)
    opt.backward(loss_fn(model, batches(1)[0], torch.float32))
    assert opt.step()
    assert opt.global_grad_norm == pytest.approx(norm, rel=1e-5)
    expected = before - grads * (0.05 / (norm + 1e-6))
    torch.testing.assert_close(flat_weights(model), expected, rtol=1e-5, atol=1e-7)


def test_no_clip_below_threshold_only_unscales():
    model = make_model()
    opt = MixedPrecisionOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        scaler=StaticLossScaler(1024.0),
        dtype=torch.float32,
        clip_grad=100.0,
    )
    ref = make_model()
    loss_fn(ref, batches(1)[0], torch.float32).backward()
    grads = torch.cat([p.grad.flatten() for p in ref.parameters()])
    before = flat_weights(model)
    opt.backward(loss_fn(model, batches(1)[0], torch.float32))
    opt.step()
    torch.testing.assert_close(flat_weights(model), before - grads, rtol=1e-5, atol=1e-7)


def test_params_without_grad_are_not_stepped():
    model = make_model(dtype=torch.bfloat16)
    extra = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    inner = torch.optim.AdamW([*model.parameters(), extra], lr=0.1, weight_decay=0.5)
    opt = MixedPrecisionOptimizer(inner, dtype=torch.bfloat16)
    train(model, opt, batches(3), torch.bfloat16)
    assert torch.equal(extra.detach(), torch.ones(3, dtype=torch.bfloat16))
    assert len(opt.state) == len(list(model.parameters()))


def test_frozen_params_stay_out_of_the_flat_space():
    model = make_model(dtype=torch.bfloat16)
    model.fc1.bias.requires_grad_(False)
    opt = MixedPrecisionOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), dtype=torch.bfloat16)
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert opt.groups[0].numel == n


def test_fp32_grad_accumulation_sums_micro_steps_in_fp32():
    data = batches(4, batch=4)
    model, opt = make_wrapped(torch.bfloat16, fp32_grad_accum=True)
    ref = make_model(dtype=torch.bfloat16)
    expected = None
    for b in data:
        opt.backward(loss_fn(model, b, torch.bfloat16))
        assert all(p.grad is None for p in model.parameters())  # released into the fp32 buffer
        ref.zero_grad()
        loss_fn(ref, b, torch.bfloat16).backward()
        g = torch.cat([p.grad.float().flatten() for p in ref.parameters()])
        expected = g if expected is None else expected + g
    assert torch.equal(opt.groups[0].flat_grad, expected)
    assert opt.step()
    opt.zero_grad()
    assert not opt.groups[0].flat_grad.any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_no_fp32_gradient_buffer_lives_between_steps(dtype):
    """Issue 18: after a step a low-precision rank holds its weights, the fp32 master and Adam's moments;
    the fp32 gradient copy exists only inside step() (the model's grads carry the next ones)."""
    before = live_storage_bytes()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8)).to(dtype)
    numel = sum(p.numel() for p in model.parameters())
    opt = MixedPrecisionOptimizer(
        torch.optim.Adam(model.parameters()), dtype=dtype, scaler=StaticLossScaler(1.0)
    )
    for _ in range(2):
        opt.backward(model(torch.randn(4, 256, dtype=dtype)).float().square().mean())
        assert opt.step()
        opt.zero_grad()
    live = live_storage_bytes() - before
    # 2 bytes of weights + 4 of fp32 master + 8 of moments per parameter, and a few scalars
    assert 14 * numel <= live <= 14 * numel + 1024, (live, numel)
    assert all(flat.flat_grad is None for flat in opt.groups)


def test_reduction_params_expose_the_fp32_buffers_to_a_reducer():
    model, opt = make_wrapped(torch.bfloat16, fp32_grad_accum=True)
    carriers = opt.reduction_params()
    flat = opt.groups[0]
    assert len(carriers) == len(flat.model_params)
    opt.backward(loss_fn(model, batches(1, batch=4)[0], torch.bfloat16))
    # a reducer averaging carrier.grad in place averages the fp32 buffer itself
    for c, view in zip(carriers, flat.grad_views):
        assert c.grad.data_ptr() == view.data_ptr() and c.shape == view.shape
        c.grad.mul_(0.5)
    assert torch.equal(torch.cat([c.grad.flatten() for c in carriers]), flat.flat_grad)
    opt.gradients_reduced()  # afterwards every parameter holds a (possibly zero) averaged gradient
    assert all(flat.accumulated)
    assert opt.reduction_params() is carriers  # built once
    _, plain = make_wrapped(torch.bfloat16)
    assert plain.reduction_params() is None  # the model's own gradients are reduced


def test_repeated_overflow_at_minimum_stops_naming_the_parameter():
    model, opt = make_wrapped(
        torch.float16,
        scaler=DynamicLossScaler(initial_scale_power=0, hysteresis=1, max_overflows_at_min_scale=3),
    )
    with pytest.raises(OverflowAtMinimumScaleError) as err:
        train(model, opt, batches(5), torch.float16, inject=_inject(math.inf, set(range(5)), "fc2.weight"))
    assert err.value.param_names == ("fc2.weight",)
    assert "fc2.weight" in str(err.value) and "bf16" in str(err.value)
    assert opt.skipped_steps == 3


def test_skipped_steps_are_logged_once_per_interval(caplog):
    model, opt = make_wrapped(torch.bfloat16, log_interval_steps=4)
    with caplog.at_level(logging.WARNING, logger="ds_precision"):
        train(model, opt, batches(12), torch.bfloat16, inject=_inject(math.nan, {0, 1, 2, 9}))
    messages = [r.getMessage() for r in caplog.records if r.name == "ds_precision"]
    assert len(messages) == 2
    assert "skipped 3 of the last 4" in messages[0] and "skipped 1 of the last 4" in messages[1]
    assert opt.skipped_steps == 4


def test_finite_grads_whose_fp32_square_sum_overflows_are_not_an_overflow():
    p = torch.nn.Parameter(torch.zeros(4))
    opt = MixedPrecisionOptimizer(torch.optim.SGD([p], lr=0.0), dtype=torch.float32, clip_grad=1.0)
    p.grad = torch.full((4,), 1e20)
    assert opt.step()
    assert opt.global_grad_norm == pytest.approx(2e20)


def test_lr_lives_in_the_inner_param_groups():
    model, opt = make_wrapped(torch.bfloat16)
    opt.param_groups[0]["lr"] = 0.0
    before = flat_weights(model)
    train(model, opt, batches(2), torch.bfloat16)
    # AdamW with lr 0 changes nothing
    assert torch.equal(flat_weights(model), before)


def test_fp16_defaults_to_a_dynamic_scaler():
    model = make_model(dtype=torch.float16)
    opt = MixedPrecisionOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), dtype=torch.float16)
    assert isinstance(opt.scaler, DynamicLossScaler) and opt.loss_scale == 2.0**32


def test_invalid_arguments():
    model = make_model()
    with pytest.raises(ValueError, match="dtype"):
        MixedPrecisionOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), dtype=torch.int8)
    with pytest.raises(ValueError, match="clip_grad"):
        MixedPrecisionOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), dtype=torch.float32, clip_grad=-1
        )
    half = make_model(dtype=torch.float16)
    with pytest.raises(ValueError, match="master_weights"):
        MixedPrecisionOptimizer(
            torch.optim.SGD(half.parameters(), lr=0.1),
            dtype=torch.float16,
            master_weights=False,
            fp32_grad_accum=True,
        )
