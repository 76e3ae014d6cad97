"""Elastic training: time from a lost host to the first step on the survivors, and steps of work lost.

    python tools/bench/bench_elastic.py [--repeats 3] [--json OUT]     (root: it makes namespace hosts)

Each repeat runs integration/scripts/elastic_train.py under ``ds-launch --elastic --launcher ssh`` on two
test hosts (testing/hosts), one rank each, a checkpoint every 2 steps, 0.5 s per step; node1 is lost (every
process killed, ssh refused) once step 5 is done. Recorded per repeat: the job's cold start (launch to its
first step, the floor of any restart), the recovery (host lost to the first step at world size 1), its
detection part (host lost to the restart's report), and the steps lost (done before the loss, redone after).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "testing"))
from hosts import Cluster  # noqa: E402

SCRIPT = ROOT / "integration" / "scripts" / "elastic_train.py"
STEPS = 8


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def one(cluster: Cluster, work: Path) -> dict:
    out = work / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "ds_launch.cli", "-H", str(cluster.hostfile(work / "hostfile", slots=1)),
           "--launcher", "ssh", "--ssh_cmd", str(cluster.ssh), "--elastic", "--elastic_checkpoint_dir",
           str(out / "ckpt"), "--export", "OMP_NUM_THREADS=1", str(SCRIPT), str(out), str(STEPS),
           "--step-seconds", "0.5"]  # fmt: skip
    started = time.time()
    job = cluster.popen("node0", ["env", "-C", str(work), *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True)  # fmt: skip
    while job.poll() is None and not any(r.get("step") == 5 for r in _log(out / "losses.jsonl")):
        time.sleep(0.05)
    lost = time.time()
    cluster.kill_host("node1")
    reported = None
    stderr_lines = []
    for line in job.stderr:  # the restart's report: the detection is over
        stderr_lines.append(line)
        if reported is None and "restart 1 on" in line:
            reported = time.time()
    job.wait(300)
    cluster.heal("node1")
    log = _log(out / "losses.jsonl")
    resume = next(i for i, r in enumerate(log) if "resumed" in r)
    before = [r for r in log[:resume] if "step" in r]
    after = [r for r in log[resume + 1 :] if "step" in r]
    return {
        "rc": job.returncode,
        "cold_start_s": before[0]["t"] - started,
        "recovery_s": after[0]["t"] - lost,
        "detection_s": (reported or lost) - lost,
        "steps_lost": before[-1]["step"] - log[resume]["resumed"],
        "world_after": after[0]["world"],
        "stderr_tail": "".join(stderr_lines[-6:]) if job.returncode else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    paths = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))] + [str(ROOT / "testing"), str(ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    runs = []
    with Cluster(2) as cluster:
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(one(cluster, Path(tmp)))
                print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for key in ("cold_start_s", "recovery_s", "detection_s", "steps_lost"):
        values = [r[key] for r in runs]
        summary[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),  # fmt: skip
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "versions": {"python": platform.python_version()},
        "loadavg_before": load_before,
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
        "summary": summary,
        "runs": runs,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
