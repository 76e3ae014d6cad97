"""Save a sharded training state at 2 real ranks, load it at 1, 2 and 4, continue Adam."""

from __future__ import annotations

import warnings

import ds_checkpoint
import pytest
import torch
from _sharded import GROUPS, STATES, adam_step, full_state, grad_for, partition, shard_of
from ds_checkpoint import TagValidationError, load_state, save_state
from rank_testing import spawn

SAVE_STEP, TOTAL_STEPS = 3, 5


def _train(full, first_step: int, last_step: int) -> None:
    for step in range(first_step, last_step + 1):
        for g in range(len(GROUPS)):
            adam_step({s: full[s][g] for s in STATES}, grad_for(g, step), step)


def _save_at_2(rank: int, world_size: int, save_dir: str) -> None:
    full = full_state()
    _train(full, 1, SAVE_STEP)
    torch.manual_seed(1234 + rank)
    model = {name: torch.zeros(shape) for params in GROUPS for name, shape in params}
    save_state(
        save_dir,
        f"global_step{SAVE_STEP}",
        model_state=model,
        optimizer_shard=shard_of(full, SAVE_STEP, rank, world_size),
        counters={"global_steps": SAVE_STEP},
        client_state={"epoch": 1, "ids": torch.arange(3)} if rank == 0 else {"epoch": 1},
        lr_scheduler={"last_epoch": SAVE_STEP},
    )


def _load_and_continue(rank: int, world_size: int, save_dir: str):
    state = load_state(save_dir)
    shards = [partition(g, rank, world_size) for g in range(len(GROUPS))]
    tensors, meta = state.optimizer_shard(shards, rank, world_size)
    step = meta["groups"][0]["scalars"]["step"]
    loaded = {k: v.clone() for k, v in tensors.items()}
    for s in range(step + 1, TOTAL_STEPS + 1):
        for g, (start, end) in enumerate(shards):
            adam_step({st: tensors[f"g{g}.{st}"] for st in STATES}, grad_for(g, s)[start:end], s)
    rng_restored = state.restore_rng(rank)
    # tensors cannot cross the process boundary after the worker exits: return plain lists
    return {
        "shards": shards,
        "loaded": {k: v.tolist() for k, v in loaded.items()},
        "continued": {k: v.tolist() for k, v in tensors.items()},
        "meta": meta,
        "client_state": {**state.client_state, "ids": state.client_state["ids"].tolist()},
        "counters": state.counters,
        "rng_restored": rng_restored,
        "rng_draw": torch.rand(1).item(),
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("ckpt")
    spawn(_save_at_2, 2, str(save_dir))
    return save_dir


@pytest.mark.parametrize("new_world", [1, 2, 4])
def test_load_at_any_world_size_gives_exact_slices_and_continues_like_uninterrupted(saved, new_world):
    at_save = full_state()
    _train(at_save, 1, SAVE_STEP)
    uninterrupted = full_state()
    _train(uninterrupted, 1, TOTAL_STEPS)
    results = spawn(_load_and_continue, new_world, str(saved))
    for rank, res in enumerate(results):
        for g, (start, end) in enumerate(res["shards"]):
            assert res["meta"]["groups"][g]["shard"] == [start, end]
            for s in STATES:
                assert res["loaded"][f"g{g}.{s}"] == at_save[s][g][start:end].tolist(), (rank, g, s)
                assert res["continued"][f"g{g}.{s}"] == uninterrupted[s][g][start:end].tolist(), (rank, g, s)
        assert res["meta"]["extra"] == {"loss_scale": 1024.0}
        assert res["counters"] == {"global_steps": SAVE_STEP}
        assert res["client_state"]["epoch"] == 1
        assert res["client_state"]["ids"] == [0, 1, 2]
        # ranks that existed at save time get their own RNG stream back
        assert res["rng_restored"] == (rank < 2)
    torch.manual_seed(1234)
    assert results[0]["rng_draw"] == torch.rand(1).item()


def test_only_overlapping_shard_files_are_opened(saved):
    state = load_state(saved, load_model=False)
    part = partition(0, 0, 2)
    state.read_shard(0, 0, part[1])
    opened = sorted(f for f in state._files if f.startswith("optim_"))
    assert opened == ["optim_rank00000.safetensors"]
    state.read_shard(1, 0, 13)
    opened = sorted(f for f in state._files if f.startswith("optim_"))
    assert opened == ["optim_rank00000.safetensors", "optim_rank00001.safetensors"]


def test_read_shard_function_matches_full_state(saved):
    at_save = full_state()
    _train(at_save, 1, SAVE_STEP)
    ckpt = saved / f"global_step{SAVE_STEP}"
    got = ds_checkpoint.read_shard(ckpt, 0, 5, 21)
    for s in STATES:
        assert torch.equal(got[s], at_save[s][0][5:21])
    assert ds_checkpoint.read_shard(ckpt, 1, 4, 4)["master"].numel() == 0


def _tagged_save(rank: int, world_size: int, save_dir: str):
    """Per mode: (same tag accepted, outcome of rank-specific tags, warnings)."""
    results = {}
    for mode in ("Warn", "fail", "Ignore"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok_same = (
                save_state(f"{save_dir}/{mode}", "same", tag_validation=mode, save_rng=False).name == "same"
            )
            try:
                path = save_state(
                    f"{save_dir}/{mode}", f"tag-of-rank{rank}", tag_validation=mode, save_rng=False
                )
                outcome = f"saved {path.name}"
            except TagValidationError as e:
                outcome = str(e)
        results[mode] = (ok_same, outcome, [str(w.message) for w in caught])
    return results


def test_tag_validation_warn_fail_ignore_across_ranks(tmp_path):
    for rank, res in enumerate(spawn(_tagged_save, 2, str(tmp_path))):
        ok_same, outcome, caught = res["Warn"]
        assert ok_same and outcome == "saved tag-of-rank0"  # rank 0's tag wins
        assert any(
            f"[rank={rank}] The checkpoint tag name 'tag-of-rank{rank}' is not consistent" in m
            for m in caught
        )
        ok_same, outcome, _ = res["fail"]
        assert ok_same
        assert f"[rank={rank}] The checkpoint tag name 'tag-of-rank{rank}' is not consistent" in outcome
        ok_same, outcome, caught = res["Ignore"]
        assert ok_same and outcome == "saved tag-of-rank0" and not caught
    assert (tmp_path / "Warn" / "latest").read_text() == "tag-of-rank0"
    assert (tmp_path / "fail" / "latest").read_text() == "same"


def test_tag_validation_rejects_unknown_mode():
    with pytest.raises(ValueError, match="expecting one of"):
        ds_checkpoint.validate_tag("t", "Maybe")
