"""Two real gloo ranks: no_sync keeps gradients local; ranks disagreeing on save_dir write one checkpoint into rank 0's."""

from __future__ import annotations

import warnings
from pathlib import Path

import ds_engine
import pytest
import torch
from rank_testing import spawn

CFG = {"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _grads_after_backward(rank: int, world: int) -> dict[str, list[torch.Tensor]]:
    engine, *_ = ds_engine.initialize(model=net(), config=CFG)
    x = torch.full((2, 4), float(rank + 1))  # each rank its own data, so local gradients differ
    out = {}
    with engine.no_sync():
        engine.backward(engine(x).pow(2).mean())
    out["no_sync"] = [p.grad.clone() for p in engine.module.parameters()]
    engine.zero_grad()
    engine.backward(engine(x).pow(2).mean())
    out["synced"] = [p.grad.clone() for p in engine.module.parameters()]
    return out


def _all_checks(rank: int, world: int, root: str) -> dict:
    """The three checks below in one pair of ranks: each takes milliseconds, starting two ranks seconds."""
    return {
        "grads": _grads_after_backward(rank, world),
        "own_dir": _save_to_own_dir(rank, world, str(Path(root) / "own")),
        "same_dir": _save_same(rank, world, str(Path(root) / "same")),
    }


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[list[dict], Path]:
    root = tmp_path_factory.mktemp("ranks")
    (root / "own").mkdir()
    return spawn(_all_checks, 2, str(root)), root


def test_no_sync_keeps_the_boundary_gradients_local(ranks):
    r0, r1 = (r["grads"] for r in ranks[0])
    assert not all(torch.equal(a, b) for a, b in zip(r0["no_sync"], r1["no_sync"], strict=True))
    for a, b in zip(r0["synced"], r1["synced"], strict=True):
        assert torch.allclose(a, b)
    # the synced gradient is the mean of the two local ones
    for a, b, s in zip(r0["no_sync"], r1["no_sync"], r0["synced"], strict=True):
        assert torch.allclose((a + b) / 2, s, atol=1e-6)


def _save_to_own_dir(rank: int, world: int, root: str) -> dict:
    """Each rank names its own folder (a per-rank timestamp, as DeepSpeed's BERT example does)."""
    cfg = {**CFG, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}}

    def one_step(engine) -> None:
        engine.backward(engine(torch.full((2, 4), float(rank + 1))).pow(2).mean())
        engine.step()

    engine, *_ = ds_engine.initialize(model=net(), config=cfg)
    one_step(engine)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = engine.save_checkpoint(Path(root) / f"run-rank{rank}")
    fresh, *_ = ds_engine.initialize(model=net(), config=cfg)
    loaded, _ = fresh.load_checkpoint(Path(root) / "run-rank0")
    one_step(engine)
    one_step(fresh)  # the optimizer state was restored too: the next step is the same
    same = all(torch.equal(a, b) for a, b in zip(engine.module.parameters(), fresh.module.parameters()))
    return {
        "written": written,
        "loaded": str(loaded) if loaded else None,
        "same_after_step": same,
        "warnings": [str(w.message) for w in caught if "save_dirs" in str(w.message)],
    }


def test_ranks_with_different_save_dirs_write_one_complete_checkpoint_into_rank_0s(ranks):
    results, tmp_path = [r["own_dir"] for r in ranks[0]], ranks[1] / "own"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-rank0"]  # nothing scattered elsewhere
    shards = sorted(p.name for p in (tmp_path / "run-rank0" / "global_step1").glob("optim_rank*.json"))
    assert shards == ["optim_rank00000.json", "optim_rank00001.json"]
    for result in results:
        assert result["written"] and result["same_after_step"], result
        assert result["loaded"] == str(tmp_path / "run-rank0" / "global_step1")
    # one warning, on rank 0, naming the folder the other rank asked for
    assert results[1]["warnings"] == [] and len(results[0]["warnings"]) == 1
    assert str(tmp_path / "run-rank0") in results[0]["warnings"][0]
    assert "rank 1: " + repr(str(tmp_path / "run-rank1")) in results[0]["warnings"][0]


def test_ranks_agreeing_on_save_dir_still_save(ranks):
    tmp_path = ranks[1] / "same"
    assert (tmp_path / "latest").read_text().strip() == "global_step0"
    assert sorted(p.name for p in (tmp_path / "global_step0").glob("optim_rank*.json")) == [
        "optim_rank00000.json",
        "optim_rank00001.json",
    ]


def _save_same(rank: int, world: int, root: str) -> None:
    cfg = {**CFG, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}}
    engine, *_ = ds_engine.initialize(model=net(), config=cfg)
    engine.save_checkpoint(root)
