"""ZeRO across real (namespace) hosts: ``ds-launch --hostfile`` through mpirun and the test hosts' ssh-like agent.

Three launches of 4 ranks: every ZeRO stage, fp32 and bf16, with and without CPU offload, on 3 hosts (node0 with
2 ranks, node1 and node2 with 1: uneven local world sizes), checkpoints at step 3; the checkpoints resumed on
2 hosts (node1 and node2, 2 ranks each, launched from node0) and on 1 host (node2's 4 ranks, ds-launch's local
launcher run there). The hosts share one /dev/shm (``own_shm=False``), so a file every rank
can open is there to mislead: ZeRO's shared-memory transport (asked for by name) must still refuse a group
that spans hosts, and take the group of one host. Losses equal single-process torch (the same tolerance as
test_engine_parity.py), and the resumes equal the uninterrupted run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hosts import Cluster, require_hosts

from conftest import HERE, world_size

pytest.importorskip("mpi4py")
pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(
        world_size() != 2, reason="its own hosts and world sizes: run once, in the 2-rank session"
    ),
]

SCRIPT = HERE / "scripts" / "engine_parity.py"
CONFIGS = [f"stage{s}-{p}-gas{g}" for s, p, g in
           [(0, "fp32", 1), (0, "bf16", 4), (1, "fp32", 4), (1, "bf16", 1), (2, "fp32", 1), (2, "bf16", 4),
            (3, "fp32", 1), (3, "bf16", 4)]] + ["stage2-fp32-gas1-offload", "stage3-fp32-gas1-offload"]  # fmt: skip
RESUME = ["stage2-bf16-gas4", "stage3-fp32-gas1"]
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2}  # against plain fp32 torch on one process (test_engine_parity.py)


def _launch(
    cluster: Cluster, slots: dict[str, int], out: Path, *args: str, on: str = "node0"
) -> tuple[dict, str]:
    """``ds-launch`` started on host ``on`` with a hostfile of ``slots``: mpirun across hosts, or the local
    launcher where the hostfile names only ``on``."""
    hostfile = cluster.hostfile(out.with_suffix(".hosts"), slots=slots, names=list(slots))
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "DS_ZERO_COLLECTIVES": "shm"}  # fmt: skip
    launcher_args = f"--mca plm_rsh_agent {cluster.ssh} -x DS_ZERO_COLLECTIVES=shm -x OMP_NUM_THREADS=1"
    argv = [
        "ds-launch",
        "--hostfile",
        str(hostfile),
        "--launcher_args",
        launcher_args,
        str(SCRIPT),
        str(out),
        *args,
    ]
    proc = cluster.run(on, argv, env=env, cwd=str(cluster.shared), timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    return json.loads(out.read_text()), log


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    require_hosts()
    reference = tmp_path_factory.mktemp("ref") / "ref.json"
    fp32 = [a for name in CONFIGS if "fp32" in name for a in ("--only", name)]
    subprocess.run([sys.executable, str(SCRIPT), str(reference), "--reference", *fp32], check=True)
    with Cluster(3, own_shm=False) as cluster:
        ckpt = cluster.shared / "ckpt"
        only = [a for name in CONFIGS for a in ("--only", name)]
        save_for = [a for name in RESUME for a in ("--save-for", name)]
        three = _launch(cluster, {"node0": 2, "node1": 1, "node2": 1}, cluster.shared / "three.json", *only,
                        "--save", str(ckpt), "--save-at", "3", *save_for)  # fmt: skip
        resume = [a for name in RESUME for a in ("--resume", f"{name}:{name}")]
        resume += ["--load", str(ckpt), "--start", "3", "--steps", "3"]
        two = _launch(cluster, {"node1": 2, "node2": 2}, cluster.shared / "two.json", *resume)
        one = _launch(cluster, {"node2": 4}, cluster.shared / "one.json", *resume, on="node2")
    return {"reference": json.loads(reference.read_text())["losses"], "three": three, "two": two, "one": one}


def _max_rel(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def test_every_stage_across_three_hosts_trains_like_one_process(runs):
    result, _ = runs["three"]
    assert result["world_size"] == 4
    failures = []
    for name in CONFIGS:
        precision = name.split("-")[1]
        err = _max_rel(
            result["losses"][name], runs["reference"].get(name, runs["reference"]["stage0-fp32-gas1"])
        )
        if err > TOLERANCE[precision]:
            failures.append(f"{name}: {err:.2e} > {TOLERANCE[precision]:.0e}")
        if result["replica_divergence"][name] != 0.0:
            failures.append(f"{name}: ranks hold different weights ({result['replica_divergence'][name]})")
    assert not failures, "\n".join(failures)


def test_shared_memory_only_among_ranks_of_one_host(runs):
    """One /dev/shm under every host: the groups spanning hosts are refused by what the ranks report (their
    hosts), and the 4 ranks of one host take it."""
    for name, hosts in (("three", "3 hosts (node0: ranks 0, 1; node1: ranks 2; node2: ranks 3)"),
                        ("two", "2 hosts (node1: ranks 0, 1; node2: ranks 2, 3)")):  # fmt: skip
        result, log = runs[name]
        assert result["shm_collectives"] == 0, f"{name}: ZeRO used shared memory across hosts"
        assert (
            result["mpi_collectives"] == 0
        )  # DS_ZERO_COLLECTIVES=shm: torch.distributed (gloo) carries them
        assert f"the group's ranks are on {hosts}" in log, log[-3000:]
    result, _ = runs["one"]
    assert result["shm_collectives"] > 0, "the 4 ranks of one host did not use shared memory"


def test_checkpoint_of_three_hosts_resumes_on_two_and_on_one(runs):
    three = runs["three"][0]["losses"]
    for where in ("two", "one"):
        resumed = runs[where][0]["losses"]
        for name in RESUME:
            tol = 1e-5 if "fp32" in name else 1e-3
            err = _max_rel(resumed[f"{name}<-{name}"], three[name][3:])
            assert err <= tol, f"{name} saved on 3 hosts, resumed on {where}: {err:.2e}"
