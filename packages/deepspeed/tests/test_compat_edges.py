"""Edge behaviours DeepSpeed 0.19.8's own tests pin, against its record (``fixtures/deepspeed_compat.json``,
"edges" and "save_load_edges", written by ``tools/fixtures/make_deepspeed_compat_fixtures.py`` from the cases in
``tools/fixtures/deepspeed_compat_cases.py``): the same functions run here under ds.

- ``init_distributed(dist_init_required=False)`` with no process group raises DeepSpeed's AssertionError at
  once (it must never wait for a job);
- an unknown ``checkpoint.tag_validation`` is a ``deepspeed.DeepSpeedConfigError``;
- ``OneCycle`` with per-group momentum lists: every group's lr and betas, step by step, from construction on;
- a save right after ``initialize`` then a load, a load right before a save, a save in the middle of a
  gradient accumulation, at ZeRO 2 and 3 on 2 ranks;
- a save with frozen weights excluded: ds writes its own pickle-free format, not DeepSpeed's
  ``mp_rank_00_model_states.pt`` (a deliberate difference, docs/deepspeed-api.md); the test pins it. Loading
  it back, as loading DeepSpeed's (converted by ``python -m ds_checkpoint import-deepspeed``; DeepSpeed's own
  files recorded in ``fixtures/frozen_excluded``), fails strictly with DeepSpeed's RuntimeError and loads
  with ``load_module_strict=False``, at ZeRO 0, 2 and 3;
- a load of a tag that has no checkpoint is DeepSpeed's AssertionError (ds's ``CheckpointTagNotFoundError``,
  naming the missing directory).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rank_testing import spawn

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_compat.json").read_text())
FROZEN_DIR = str(Path(__file__).parent / "fixtures/frozen_excluded")
FIXTURES = str(Path(__file__).resolve().parents[3] / "tools/fixtures")
sys.path.insert(0, FIXTURES)
import deepspeed_compat_cases as recorder  # noqa: E402


def _run(rank: int, world_size: int, name: str):
    sys.path.insert(0, FIXTURES)
    import deepspeed_compat_cases

    return json.loads(json.dumps(getattr(deepspeed_compat_cases, name)(rank, world_size)))


def _edges(rank: int, world_size: int):
    sys.path.insert(0, FIXTURES)
    import deepspeed_compat_cases

    return json.loads(json.dumps(deepspeed_compat_cases.edge_cases()))


def _frozen(rank: int, world_size: int, save_dir: str):
    """ds's own frozen-excluded saves (the recorder's case), then DeepSpeed's recorded ones imported and loaded."""
    sys.path.insert(0, FIXTURES)
    import deepspeed_compat_cases as cases
    import ds_checkpoint

    own = cases.frozen_checkpoint_case(save_dir)
    imported = {}
    for stage in cases.FROZEN_STAGES:
        ckpt = ds_checkpoint.load_deepspeed(f"{FROZEN_DIR}/stage{stage}", "t")
        converted = f"{save_dir}/imported{stage}"
        ckpt.save(converted, "t")
        engine = cases._engine(stage, frozen=True)
        engine.load_checkpoint(converted, tag="t", load_module_strict=False)
        got = {"non_strict_sum": cases._weights_sum(engine)}
        cases._train_step(engine)
        got["sum_after_a_step"] = cases._weights_sum(engine)
        imported[f"stage{stage}"] = got
    return json.loads(json.dumps({"own": own, "imported": imported}))


def test_init_distributed_without_a_process_group_raises_at_once():
    want = RECORD["edges"]["init_distributed.dist_init_required=False"]
    assert recorder.init_without_process_group() == want  # "stalled" after 120 s otherwise


def test_tag_validation_onecycle_and_frozen_save_as_deepspeed_0_19_8():
    (got,) = spawn(_edges, 1, timeout_s=240)
    want = RECORD["edges"]
    assert got["tag_validation.foo"]["is_DeepSpeedConfigError"] is True
    assert "tag_validation" in got["tag_validation.foo"]["error"]["message"]
    for name in ("onecycle.lists", "onecycle.scalars"):
        assert got[name] == want[name], name
    # deliberate difference: ds's checkpoint format is pickle-free (safetensors + JSON)
    assert want["exclude_frozen.files"] == ["t/mp_rank_00_model_states.pt"]
    assert "t/model.safetensors" in got["exclude_frozen.files"]
    for name in ("load.unknown_tag", "load.unknown_tag.empty_dir"):
        assert want[name]["is_AssertionError"] is True and want[name]["error"]["mro"][0] == "AssertionError"
        assert got[name]["is_AssertionError"] is True, got[name]
        assert got[name]["error"]["mro"][:2] == ["CheckpointTagNotFoundError", "CheckpointNotFoundError"]
        assert got[name]["error"]["message"].endswith("/nope does not exist")


def test_frozen_excluded_checkpoints_load_as_deepspeed_0_19_8(tmp_path):
    (got,) = spawn(_frozen, 1, str(tmp_path), timeout_s=240)
    for stage in ("stage0", "stage2", "stage3"):
        want, own, imported = RECORD["frozen_checkpoints"][stage], got["own"][stage], got["imported"][stage]
        assert "model.safetensors" in own["files"] and not any(f.endswith(".pt") for f in own["files"])
        assert own["strict"]["error"]["message"] == want["strict"]["error"]["message"], stage
        assert "RuntimeError" in own["strict"]["error"]["mro"], stage
        for key in ("saved_sum", "non_strict_sum", "sum_after_a_step"):
            assert own[key] == want[key], (stage, key)
        assert imported == {k: want[k] for k in ("non_strict_sum", "sum_after_a_step")}, stage


def test_save_and_load_edges_at_zero_2_and_3():
    got = spawn(_run, 2, "save_load_edge_case", timeout_s=300)
    assert got == RECORD["save_load_edges"]
