"""ZeRO++ on 2 namespace hosts x 2 ranks through ``ds-launch --hostfile`` (mpirun): the groups ds-engine makes
from the launcher's ranks per host, hpZ's backward gathers inside a host, and the losses (hpZ equal to plain
ZeRO-3; with int8 weights and 4-bit gradients within DeepSpeed's tolerance: the mean loss below 1.1x)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from hosts import Cluster, require_hosts

from conftest import HERE, world_size

pytest.importorskip("mpi4py")
pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(
        world_size() != 2, reason="its own hosts and world size: run once, in the 2-rank session"
    ),
]

ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PYTHONUNBUFFERED": "1",
       "OMP_NUM_THREADS": "1"}  # fmt: skip


@pytest.fixture(scope="module")
def result() -> dict:
    require_hosts()
    with Cluster(2) as cluster:
        out = cluster.shared / "zeropp.json"
        hostfile = cluster.hostfile(cluster.shared / "zeropp.hosts", slots=2, names=["node0", "node1"])
        exe = shutil.which("ds-launch", path=str(Path(sys.executable).parent)) or shutil.which("ds-launch")
        argv = [exe or "ds-launch", "--hostfile", str(hostfile), "--launcher_args",
                f"--mca plm_rsh_agent {cluster.ssh} -x OMP_NUM_THREADS=1",
                str(HERE / "scripts" / "zeropp_hosts.py"), str(out)]  # fmt: skip
        proc = cluster.run("node0", argv, env=ENV, cwd=str(cluster.shared), timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
        return json.loads(out.read_text())


def test_engine_makes_the_host_groups_from_the_launchers_ranks_per_host(result):
    every = result["zeropp"]["ranks"]
    assert [r["host"] for r in every] == ["node0", "node0", "node1", "node1"]
    assert [r["hpz"] for r in every] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["local"] for r in every] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["cross"] for r in every] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert all(r["hpz"] is None for r in result["plain"]["ranks"])


def test_hpz_gathers_from_the_secondary_partitions_and_equals_plain_zero3(result):
    assert all(r["secondary_numel"] > 0 for r in result["hpz"]["ranks"])
    assert result["hpz"]["losses"] == result["plain"]["losses"]


def test_quantized_weights_and_gradients_within_deepspeeds_tolerance(result):
    plain, zeropp = result["plain"]["losses"], result["zeropp"]["losses"]
    assert zeropp != plain
    assert sum(zeropp) / len(zeropp) < 1.1 * sum(plain) / len(plain), (zeropp, plain)
