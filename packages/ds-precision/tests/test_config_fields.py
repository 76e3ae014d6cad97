"""ds_precision.CONFIG_FIELDS is exactly what its from_config functions read from the typed sections."""

import ds_precision
import pytest
import torch
from _dsp_helpers import make_model
from ds_config import load_config
from ds_config.testing import ConfigReads


def test_config_fields_match_what_the_code_reads():
    reads = ConfigReads()
    for fp16 in ({"enabled": True}, {"enabled": True, "loss_scale": 128}):  # dynamic and static branches
        cfg = reads.wrap(load_config({"train_batch_size": 1, "fp16": fp16}))
        ds_precision.loss_scaler_from_config(cfg.fp16)
    cfg = reads.wrap(load_config({"train_batch_size": 1, "amp": {"enabled": True, "opt_level": "O1"}}))
    model = make_model()
    ds_precision.amp_initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg.amp)
    reads.check("ds_precision", ds_precision.CONFIG_FIELDS)


def test_a_duck_typed_section_is_refused():
    with pytest.raises(TypeError, match="FP16Config"):
        ds_precision.loss_scaler_from_config(object())


# Each amp key read from the section, with a value whose effect is visible: the test fails if _as_dict
# stops passing that key on. (opt_level, cast_model_type and loss_scale are covered in test_amp.py.)
AMP_EFFECTS = [
    ({"opt_level": "O2", "keep_batchnorm_fp32": False}, lambda m, o: m.norm.weight.dtype == torch.float16),
    (
        {"opt_level": "O2", "master_weights": False, "keep_batchnorm_fp32": False},
        lambda m, o: o.groups[0].aliased,
    ),
    ({"opt_level": "O1", "min_loss_scale": 4.0}, lambda m, o: o.scaler.min_scale == 4.0),
    ({"opt_level": "O1", "max_loss_scale": 1024.0}, lambda m, o: o.loss_scale == 1024.0),
]


@pytest.mark.parametrize("keys, effect", AMP_EFFECTS, ids=[str(k) for k, _ in AMP_EFFECTS])
def test_each_amp_key_of_the_section_takes_effect(keys, effect):
    cfg = load_config({"train_batch_size": 1, "amp": {"enabled": True, **keys}})
    model = make_model()
    model, opt = ds_precision.amp_initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg.amp)
    assert effect(model, opt)


def test_amp_num_losses_from_the_section_needs_apex():
    cfg = load_config({"train_batch_size": 1, "amp": {"enabled": True, "num_losses": 2}})
    model = make_model()
    with pytest.raises(ValueError, match="num_losses > 1 needs NVIDIA apex"):
        ds_precision.amp_initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg.amp)


@pytest.mark.parametrize(
    "key, value", [("patch_torch_functions", True), ("verbosity", 0), ("cast_model_outputs", "float16")]
)
def test_apex_only_amp_keys_warn_that_they_have_no_effect_without_apex(caplog, key, value):
    cfg = load_config({"train_batch_size": 1, "amp": {"enabled": True, key: value}})
    model = make_model()
    with caplog.at_level("WARNING", logger="ds_precision"):
        ds_precision.amp_initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg.amp)
    assert any(key in r.getMessage() and "no effect" in r.getMessage() for r in caplog.records)


def test_amp_at_its_defaults_warns_about_nothing(caplog):
    cfg = load_config({"train_batch_size": 1, "amp": {"enabled": True}})
    model = make_model()
    with caplog.at_level("WARNING", logger="ds_precision"):
        ds_precision.amp_initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg.amp)
    assert not caplog.records


def test_max_overflows_at_min_scale_reaches_the_scaler():
    cfg = load_config(
        {"train_batch_size": 1, "fp16": {"enabled": True, "loss_scale": 8, "max_overflows_at_min_scale": 2}}
    )
    scaler = ds_precision.loss_scaler_from_config(cfg.fp16)
    scaler.update_scale(True)
    with pytest.raises(ds_precision.OverflowAtMinimumScaleError):
        scaler.update_scale(True)
