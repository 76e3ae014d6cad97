"""initialize(mpu=...): reduction over the data-parallel group, clipping by the norm over the model-parallel group."""

from __future__ import annotations

import pytest

from conftest import launch, read_json


def test_engine_reduces_over_the_mpu_data_parallel_group_only(tmp_path, ws):
    if ws < 4:  # at 2 ranks the data-parallel group would be one rank: nothing to tell apart
        pytest.skip("the mpu in this test has model-parallel size 2: data parallelism needs 4 ranks")
    launch("engine_mpu.py", str(tmp_path))
    reports = [read_json(tmp_path / f"rank{r}.json") for r in range(ws)]
    assert [(r["dp_rank"], r["mp_rank"]) for r in reports] == [(r // 2, r % 2) for r in range(ws)]
    # the two model-parallel ranks train different models: a wrong group would have mixed them
    assert reports[0]["first_weight"] != reports[1]["first_weight"]
    failures = [
        f"rank {rank} {name}: weights differ from one-process torch by {diff:.2e}"
        for rank, report in enumerate(reports)
        for name, diff in report["max_abs_diff"].items()
        if not diff < 1e-5
    ]
    assert not failures, "\n".join(failures)
