"""Weight files besides model.safetensors (one per expert) and optimizer state read by parameter name into a
layout that orders, places and pads the parameters differently from the saved one (one process)."""

from __future__ import annotations

import ds_checkpoint
import pytest
import torch
from ds_checkpoint import CheckpointError, expert_file, load_state, save_state

SAVED = [("dense.weight", (2, 3)), ("experts.0.w", (4,)), ("experts.1.w", (4,))]


def _save(path) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    flat = {s: torch.randn(14, generator=gen) for s in ("master", "exp_avg")}
    offsets = [0, 6, 10]
    meta = {
        "format": "ds-flat-shard/1",
        "world_size": 1,
        "rank": 0,
        "groups": [
            {
                "numel": 14,
                "shard": [0, 14],
                "params": [
                    {"name": n, "shape": list(s), "offset": o}
                    for (n, s), o in zip(SAVED, offsets, strict=True)
                ],
                "hparams": {"lr": 0.1},
                "scalars": {"step": 3},
            }
        ],
        "extra": {},
    }
    weights = {
        n: flat["master"][o : o + torch.Size(s).numel()].reshape(s) for (n, s), o in zip(SAVED, offsets)
    }
    save_state(
        path,
        "t",
        model_state={"dense.weight": weights["dense.weight"], "buf": torch.arange(3)},
        model_files={expert_file(0, e): {f"experts.{e}.w": weights[f"experts.{e}.w"]} for e in (0, 1)},
        optimizer_shard=({f"g0.{k}": v for k, v in flat.items()}, meta),
    )
    return {**flat, **weights}


def test_weight_files_join_the_model_state_and_the_fp32_export(tmp_path):
    saved = _save(tmp_path)
    state = load_state(tmp_path, "t")
    assert state.model_files == [
        "model.safetensors",
        "layer_0_expert_0.safetensors",
        "layer_0_expert_1.safetensors",
    ]
    assert sorted(state.model_state) == ["buf", "dense.weight", "experts.0.w", "experts.1.w"]
    assert torch.equal(state.model_state["experts.1.w"], saved["experts.1.w"])
    assert list(state.read_model(["experts.0.w"])) == ["experts.0.w"]
    exported = ds_checkpoint.fp32_state_dict(tmp_path, "t")
    assert sorted(exported) == sorted(state.model_state)
    assert torch.equal(exported["experts.1.w"], saved["experts.1.w"])
    with pytest.raises(ValueError, match="safetensors"):
        save_state(tmp_path, "u", model_files={"optim_rank00000.safetensors": {}})


def test_optimizer_state_by_parameter_name_into_another_layout(tmp_path):
    saved = _save(tmp_path)
    state = load_state(tmp_path, "t", load_model=False)
    # the loading rank holds one expert (named by its local index 0) before the dense weight, with 2 elements
    # of padding between them, and owns elements [2, 12) of that layout
    layout = {
        "format": "ds-flat-shard/1",
        "world_size": 2,
        "rank": 1,
        "groups": [
            {
                "numel": 12,
                "shard": [2, 12],
                "params": [
                    {"name": "experts.0.w", "shape": [4], "offset": 0},
                    {"name": "dense.weight", "shape": [2, 3], "offset": 6},
                ],
            }
        ],
    }
    local_to_saved = {"experts.0.w": "experts.1.w"}
    tensors, meta = state.optimizer_shard_by_name(layout, saved_name=lambda n: local_to_saved.get(n, n))
    for key in ("master", "exp_avg"):
        want = torch.cat([saved[key][12:14], torch.zeros(2), saved[key][0:6]])
        assert torch.equal(tensors[f"g0.{key}"], want), key
    group = meta["groups"][0]
    assert group["shard"] == [2, 12] and group["scalars"] == {"step": 3} and group["hparams"] == {"lr": 0.1}
    assert [p["name"] for p in group["params"]] == ["experts.0.w", "dense.weight"]
    layout["groups"][0]["params"][0]["name"] = "experts.7.w"
    with pytest.raises(CheckpointError, match="experts.7.w"):
        state.optimizer_shard_by_name(layout)
