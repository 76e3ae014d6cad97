"""Engine calls Lightning's DeepSpeedStrategy makes, with DeepSpeed's meaning."""

from __future__ import annotations

from pathlib import Path

import ds_checkpoint
import ds_engine
import torch

CFG = {"train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.5}}}


def test_save_checkpoint_exclude_frozen_parameters_leaves_them_out(tmp_path: Path):
    """Lightning passes ``exclude_frozen_parameters`` (its strategy option, default False) on every save."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    model[0].requires_grad_(False)
    engine, *_ = ds_engine.initialize(model=model, config=dict(CFG))
    engine.save_checkpoint(tmp_path, tag="all", exclude_frozen_parameters=False)
    engine.save_checkpoint(tmp_path, tag="trained", exclude_frozen_parameters=True)
    assert set(ds_checkpoint.load_state(tmp_path, "all").model_state) == set(model.state_dict())
    assert set(ds_checkpoint.load_state(tmp_path, "trained").model_state) == {"1.weight", "1.bias"}
    # loading it back needs load_module_strict=False, as in DeepSpeed; the trained weights come back
    _, client = engine.load_checkpoint(tmp_path, tag="trained", load_module_strict=False)
    assert client == {}
