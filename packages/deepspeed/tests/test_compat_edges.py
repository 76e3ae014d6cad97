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
  ``mp_rank_00_model_states.pt`` (a deliberate difference, docs/deepspeed-api.md); the test pins it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rank_testing import spawn

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_compat.json").read_text())
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


def test_save_and_load_edges_at_zero_2_and_3():
    got = spawn(_run, 2, "save_load_edge_case", timeout_s=300)
    assert got == RECORD["save_load_edges"]
