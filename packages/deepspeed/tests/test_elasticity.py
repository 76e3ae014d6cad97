"""``deepspeed.elasticity.compute_elastic_config`` gives DeepSpeed's answers (0.14.4, the last release that has
elastic training) over a grid of sections and world sizes: the result, or the error's class and message.
The fixture is recorded by tools/fixtures/record_elasticity.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from deepspeed import elasticity

CASES = json.loads((Path(__file__).parent / "fixtures" / "elasticity_0.14.4.json").read_text())["cases"]


def _outcome(section: dict, world_size: int) -> dict:
    try:
        r = elasticity.compute_elastic_config({"elasticity": section}, "0.14.4", world_size=world_size)
        return {"result": [int(r[0]), [int(g) for g in r[1]], *[int(x) for x in r[2:]]]}
    except Exception as exc:  # the error is the answer
        return {"error": type(exc).__name__, "message": str(exc)}


def test_same_answers_as_deepspeed(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    wrong = []
    for case in CASES:
        want = {k: v for k, v in case.items() if k in ("result", "error", "message")}
        if "message" in want:  # DeepSpeed's numpy integers print as np.int64(n)
            want["message"] = re.sub(r"np\.int64\((\d+)\)", r"\1", want["message"])
        got = _outcome(case["elasticity"], case["world_size"])
        if got != want:
            wrong.append((case["elasticity"], case["world_size"], want, got))
    assert not wrong, f"{len(wrong)} of {len(CASES)} differ, e.g. {wrong[:3]}"


def test_scheduler_config_must_match(monkeypatch):
    monkeypatch.setenv("DEEPSPEED_ELASTICITY_CONFIG", json.dumps({"max_train_batch_size": 100}))
    with pytest.raises(elasticity.ElasticityConfigError, match="max_acceptable_batch_size=100"):
        elasticity.ensure_immutable_elastic_config({"max_train_batch_size": 200})
    elasticity.ensure_immutable_elastic_config({"max_train_batch_size": 100})
    assert elasticity.elasticity_enabled({"elasticity": {"enabled": True}})
