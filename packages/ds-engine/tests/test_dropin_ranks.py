"""Two real gloo ranks: no_sync keeps gradients local; ranks disagreeing on save_dir fail before writing."""

from __future__ import annotations

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


def _save_to_own_dir(rank: int, world: int, root: str) -> str:
    engine, *_ = ds_engine.initialize(model=net(), config=CFG)
    own = Path(root) / f"run-rank{rank}"  # e.g. a per-rank timestamp in the folder name
    try:
        engine.save_checkpoint(own)
    except Exception as exc:  # every rank must fail, with the same message
        return f"{type(exc).__name__}: {exc}"
    return "saved"


def test_ranks_with_different_save_dirs_fail_on_every_rank_before_writing(ranks):
    results, tmp_path = [r["own_dir"] for r in ranks[0]], ranks[1] / "own"
    for message in results:
        assert message.startswith("SaveDirMismatchError")
        assert str(tmp_path / "run-rank0") in message and str(tmp_path / "run-rank1") in message
        assert "Nothing was written" in message
    assert list(tmp_path.iterdir()) == []


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
