"""amp without apex: opt levels O0-O3 on torch.autocast and this package's scaler."""

import importlib.util
from types import SimpleNamespace

import pytest
import torch
from _dsp_helpers import batches, make_model
from ds_precision import (
    DynamicLossScaler,
    MixedPrecisionOptimizer,
    StaticLossScaler,
    amp_backward,
    amp_initialize,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("apex") is not None,
    reason="apex is installed: amp_initialize hands over to apex",
)


def _amp_section(**fields):
    try:
        from ds_config import AmpConfig  # the real section model once it exists
    except ImportError:
        return SimpleNamespace(**fields)
    return AmpConfig(**fields)


def _setup(level, **extra):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return amp_initialize(model, opt, _amp_section(enabled=True, opt_level=level, **extra))


def _train(model, opt, n=3):
    losses = []
    for x, y in batches(n, batch=4):
        out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        amp_backward(loss, opt)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return out, losses


def test_o0_is_plain_fp32():
    model, opt = _setup("O0")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert isinstance(opt.scaler, StaticLossScaler) and opt.loss_scale == 1.0
    out, _ = _train(model, opt)
    assert out.dtype == torch.float32


def test_o1_autocasts_an_fp32_model_with_dynamic_scaling():
    model, opt = _setup("O1")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert isinstance(opt, MixedPrecisionOptimizer) and isinstance(opt.scaler, DynamicLossScaler)
    out, _ = _train(model, opt, n=20)  # the default scale 2**32 overflows for its first steps
    assert out.dtype == torch.float16
    assert opt.skipped_steps > 0 and opt.global_steps - opt.skipped_steps > 0


def test_o2_half_model_norm_layers_fp32_fp32_master_weights():
    model, opt = _setup("O2", loss_scale=128.0)
    assert model.fc1.weight.dtype == torch.float16 and model.norm.weight.dtype == torch.float32
    assert opt.groups[0].flat_master.dtype == torch.float32 and not opt.groups[0].aliased
    assert opt.loss_scale == 128.0
    before = model.fc1.weight.detach().clone()
    _train(model, opt)
    assert not torch.equal(before, model.fc1.weight)
    assert torch.equal(opt.groups[0].masters[0].detach().half(), model.fc1.weight.detach())


def test_o3_pure_half_without_master_weights():
    model, opt = _setup("O3")
    assert all(p.dtype == torch.float16 for p in model.parameters())
    assert opt.groups[0].aliased and opt.groups[0].flat_master.dtype == torch.float16
    assert opt.loss_scale == 1.0
    _train(model, opt)


def test_bf16_cast_model_type_uses_no_loss_scaling():
    model, opt = _setup("O2", cast_model_type="bfloat16")
    assert model.fc1.weight.dtype == torch.bfloat16 and opt.loss_scale == 1.0


def test_amp_dict_and_kwargs_are_accepted():
    model = make_model()
    model, opt = amp_initialize(
        model, torch.optim.SGD(model.parameters(), lr=0.1), {"opt_level": "O1"}, loss_scale=64.0
    )
    assert opt.loss_scale == 64.0


@pytest.mark.parametrize(
    "extra, match",
    [
        (dict(opt_level="O4"), "opt_level"),
        (dict(opt_level="O1", bogus=1), "bogus"),
        (dict(opt_level="O1", num_losses=2), "apex"),
        (dict(opt_level="O2", cast_model_type="int8"), "cast_model_type"),
    ],
)
def test_bad_amp_options_say_what_to_fix(extra, match):
    model = make_model()
    with pytest.raises(ValueError, match=match):
        amp_initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), extra)
