"""Frozen parameters through the engine at ZeRO-3 on 2 gloo ranks (a LoRA-style model: frozen base,
trainable adapters): each rank stores only its piece of every frozen weight (measured on the real
tensors), yet the consolidated state dict (what Accelerate's ``get_state_dict`` calls), ``save_16bit_model``
and a ``save_checkpoint``/``load_checkpoint`` round trip give the whole exact values, and the reloaded run continues with the uninterrupted run's
losses.
"""

from __future__ import annotations

import pytest
import torch
from rank_testing import spawn
from safetensors.torch import load_file
from torch import nn

WIDTH, VOCAB, MB = 32, 16, 2


class _LoRA(nn.Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.base = nn.Linear(n_in, n_out)
        self.down = nn.Linear(n_in, 4, bias=False)
        self.up = nn.Linear(4, n_out, bias=False)
        self.base.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(_LoRA(WIDTH, 4 * WIDTH), nn.ReLU(), _LoRA(4 * WIDTH, VOCAB))


def _engine(model: nn.Module):
    import ds_engine

    config = {
        "train_micro_batch_size_per_gpu": MB,
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    }
    return ds_engine.initialize(model=model, config=config)[0]


def _train(engine, rank: int, steps: range) -> list[float]:
    losses = []
    for step in steps:
        g = torch.Generator().manual_seed(step * 2 + rank)
        x, y = torch.randn(MB, WIDTH, generator=g), torch.randint(0, VOCAB, (MB,), generator=g)
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def _frozen_held(model: nn.Module) -> tuple[int, int]:
    """Bytes of the storages holding the frozen parameters now (their pieces, or whole), and of whole."""
    held = whole = 0
    for p in model.parameters():
        if not p.requires_grad:
            t = p.ds_tensor if p.data.numel() == 0 else p.data
            held += t.untyped_storage().nbytes()
            whole += p.ds_numel * p.element_size()
    return held, whole


def _round_trip(rank: int, world: int, save_dir: str) -> dict:
    model = _model(0)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    engine = _engine(model)
    held, whole = _frozen_held(model)
    first = _train(engine, rank, range(2))
    state = engine._zero3_consolidated_16bit_state_dict()  # rank 0's; {} elsewhere
    engine.save_checkpoint(save_dir, tag="t")
    engine.save_16bit_model(save_dir, "model.safetensors")
    uninterrupted = _train(engine, rank, range(2, 4))

    other = _model(1)  # other frozen values: the load must bring the saved ones
    engine2 = _engine(other)
    engine2.load_checkpoint(save_dir, tag="t")
    loaded = engine2._zero3_consolidated_16bit_state_dict()
    resumed = _train(engine2, rank, range(2, 4))
    saved16 = load_file(f"{save_dir}/model.safetensors") if rank == 0 else None
    return {
        "held": held,
        "whole": whole,
        "first": first,
        "exact": [
            rank != 0 or all(torch.equal(got[n], v) for n, v in frozen.items())
            for got in (state, loaded, saved16)
        ],
        "uninterrupted": uninterrupted,
        "resumed": resumed,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    save_dir = str(tmp_path_factory.mktemp("frozen_zero3"))
    return spawn(_round_trip, 2, save_dir, timeout_s=300, env={"DS_ZERO_COLLECTIVES": "torch"})


def test_each_rank_stores_half_of_the_frozen_weights(runs):
    for r in runs:
        assert r["whole"] / 2 <= r["held"] < r["whole"] / 2 + 64, (r["held"], r["whole"])


def test_state_dicts_and_checkpoints_hold_the_whole_exact_frozen_weights(runs):
    for r in runs:
        assert r["exact"] == [True, True, True]
        assert r["resumed"] == r["uninterrupted"]
