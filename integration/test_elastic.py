"""``ds-launch --elastic`` across two test hosts (testing/hosts): a job that loses a host goes on without it.

One rank per host trains ``scripts/elastic_train.py`` (the config's ``elasticity`` section: global batch 8 at
any world size), saving a checkpoint every 2 steps. node1 is lost (every process on it killed, ssh to it
refused) after step 5; the launcher restarts the job on node0 alone, at world size 1, from the latest
checkpoint (step 4: at most one interval of work lost), and the job ends 0 with the losses of an
uninterrupted run from the checkpoint on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hosts import cluster_fixture

from conftest import HERE, world_size

pytestmark = pytest.mark.skipif(
    world_size() != 2, reason="multi-host launches run in the 2-rank session only"
)

cluster = cluster_fixture(2)
SCRIPT = HERE / "scripts" / "elastic_train.py"
STEPS = 10


def _ds_launch() -> list[str]:
    found = shutil.which("ds-launch", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "ds_launch.cli"]


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_lost_host_costs_one_checkpoint_interval(cluster, tmp_path):
    ref = tmp_path / "reference"
    ref.mkdir()
    proc = subprocess.run([*_ds_launch(), "--num_procs", "1", str(SCRIPT), str(ref), str(STEPS)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = {r["step"]: r["loss"] for r in _log(ref / "losses.jsonl")}

    out = tmp_path / "elastic"
    out.mkdir()
    hostfile = cluster.hostfile(tmp_path / "hostfile", slots=1)
    cmd = [*_ds_launch(), "-H", str(hostfile), "--launcher", "ssh", "--ssh_cmd", str(cluster.ssh), "--elastic",
           "--elastic_checkpoint_dir", str(out / "ckpt"), "--heartbeat_timeout", "8", "--export", "OMP_NUM_THREADS=1",
           str(SCRIPT), str(out), str(STEPS), "--step-seconds", "0.5"]  # fmt: skip
    job = cluster.popen("node0", ["env", "-C", str(tmp_path), *cmd], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while job.poll() is None and time.monotonic() < deadline:
            if any(r.get("step") == 5 for r in _log(out / "losses.jsonl")):
                break
            time.sleep(0.1)
        assert job.poll() is None, job.communicate()[1][-3000:]
        cluster.kill_host("node1")
        _, stderr = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
        cluster.heal("node1")
    assert job.returncode == 0, stderr[-4000:]
    assert "ds-launch --elastic: host node1 lost" in stderr and "world size 2 -> 1" in stderr, stderr[-3000:]
    assert "restart 1 on node0: world size 1, from checkpoint global_step" in stderr, stderr[-3000:]
    log = _log(out / "losses.jsonl")
    resumed = [r for r in log if "resumed" in r]
    assert (
        len(resumed) == 1 and resumed[0]["world"] == 1 and resumed[0]["gas"] == 2
    )  # the elastic batch: 4 x 2 x 1
    at = resumed[0]["resumed"]
    lost_at = max(r["step"] for r in log[: log.index(resumed[0])] if "step" in r)
    assert lost_at - at <= 2, f"lost steps {at + 1}..{lost_at}: more than one checkpoint interval"
    after = {r["step"]: r["loss"] for r in log[log.index(resumed[0]) + 1 :]}
    assert sorted(after) == list(range(at + 1, STEPS + 1))
    assert after == pytest.approx({s: reference[s] for s in after}, rel=1e-5)
