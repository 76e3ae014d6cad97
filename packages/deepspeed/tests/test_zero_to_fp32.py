"""``deepspeed.utils.zero_to_fp32`` on a checkpoint ds wrote: the trained fp32 weights, by name."""

from __future__ import annotations

from pathlib import Path

import deepspeed
import pytest
import torch
from deepspeed.utils import zero_to_fp32

CFG = {
    "train_batch_size": 2,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    engine, *_ = deepspeed.initialize(model=model, config=dict(CFG))
    for _ in range(3):
        loss = engine(torch.randn(2, 4, dtype=torch.bfloat16)).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    save_dir = tmp_path_factory.mktemp("ckpt")
    engine.save_checkpoint(str(save_dir), tag="t3")
    return save_dir, {k: v.float().clone() for k, v in engine.module.state_dict().items()}


def test_state_dict_holds_the_trained_fp32_weights(trained):
    """Every tensor of the module, fp32, equal to the trained bf16 weights up to bf16 rounding."""
    save_dir, trained_weights = trained
    state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(save_dir)
    assert set(state) == set(trained_weights)
    assert all(t.dtype == torch.float32 for t in state.values() if t.is_floating_point())
    for name, weight in trained_weights.items():
        if weight.is_floating_point():
            torch.testing.assert_close(state[name].to(torch.bfloat16).float(), weight, rtol=0, atol=0)
    # the parameters are the fp32 masters, finer than bf16 (not the bf16 weights widened)
    assert not torch.equal(state["0.weight"], trained_weights["0.weight"])


def test_convert_and_load_round_trip(trained, tmp_path: Path):
    save_dir, _ = trained
    state = zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(save_dir, tmp_path, tag="t3")
    written = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    assert set(written) == set(state)
    torch.manual_seed(5)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    zero_to_fp32.load_state_dict_from_zero_checkpoint(fresh, save_dir)
    torch.testing.assert_close(fresh[0].weight.detach(), state["0.weight"], rtol=0, atol=0)


def test_deepspeed_file_readers_give_a_view_of_a_ds_checkpoint(trained, tmp_path: Path):
    """Lightning's converter reads the ZeRO stage and its client state through these DeepSpeed file names."""
    save_dir, trained_weights = trained
    tag_dir = save_dir / "t3"
    (optim_file,) = zero_to_fp32.get_optim_files(tag_dir)
    assert torch.load(optim_file, weights_only=True)["optimizer_state_dict"]["zero_stage"] == 2
    model = torch.load(zero_to_fp32.get_model_state_file(tag_dir, 2), weights_only=True)
    assert model["dp_world_size"] == 1 and model["global_steps"] == 3
    assert model["module"].keys() == trained_weights.keys()
    assert not list(tag_dir.glob("*.pt")), "the checkpoint folder is left as saved"


def test_deepspeed_file_readers_fail_on_other_folders(tmp_path: Path):
    with pytest.raises(deepspeed.FeatureNotAvailableError, match="not a ds checkpoint"):
        zero_to_fp32.get_model_state_file(tmp_path, 2)
