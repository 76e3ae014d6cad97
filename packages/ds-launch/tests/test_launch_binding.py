"""``--bind_cores_to_rank``: each rank of a host runs on its own share of the cores, OMP_NUM_THREADS to match."""

from __future__ import annotations

import json
import os

import pytest
from ds_launch import HostfileError
from ds_launch._binding import cores_per_rank, parse_range_list
from launch_procs import run_cli

SCRIPT = """
import json, os, sys
out = sys.argv[-1]
with open(os.path.join(out, f"aff{os.environ['RANK']}.json"), "w") as f:
    json.dump({"cores": sorted(os.sched_getaffinity(0)), "omp": os.environ.get("OMP_NUM_THREADS")}, f)
"""


def test_range_list_as_deepspeed_reads_it():
    assert parse_range_list("1,3-5,7") == [1, 3, 4, 5, 7]
    for bad, message in (("3-1", "range end must larger"), ("1-2-3", "two number separated"),
                         ("2,1", "ascend order"), ("x", "either a number")):  # fmt: skip
        with pytest.raises(HostfileError, match=message):
            parse_range_list(bad)


def test_cores_are_shared_out_in_order():
    assert cores_per_rank(2, "0-5", {}) == [[0, 1, 2], [3, 4, 5]]
    assert cores_per_rank(3, "0-7", {}) == [[0, 1], [2, 3], [4, 5]]  # DeepSpeed leaves the remainder idle
    with pytest.raises(HostfileError, match="At least one core needs to be assigned to each rank"):
        cores_per_rank(2, "4", {})
    with pytest.raises(HostfileError, match="KMP_AFFINITY"):
        cores_per_rank(1, "0", {"KMP_AFFINITY": "compact"})


def test_ranks_run_on_their_cores(tmp_path):
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("needs 2 cores to give 2 ranks one each")
    script = tmp_path / "aff.py"
    script.write_text(SCRIPT)
    cores = f"{mine[0]},{mine[1]}" if mine[1] > mine[0] else str(mine[0])
    res = run_cli(["--num_procs", "2", "--no_local_rank", "--bind_cores_to_rank", f"--bind_core_list={cores}",
                   str(script), str(tmp_path)])  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = [json.loads((tmp_path / f"aff{r}.json").read_text()) for r in range(2)]
    assert got == [{"cores": [mine[0]], "omp": "1"}, {"cores": [mine[1]], "omp": "1"}]
    assert "does not bind memory to their NUMA node" in res.stderr  # the difference from DeepSpeed is said
