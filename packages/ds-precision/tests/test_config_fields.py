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
