"""ds-launch's local launcher with real processes: environment, argv, and clean failure."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid

import pytest
from launch_procs import DS_LAUNCH, SCRIPTS, records, run_cli, wait_no_survivors

ENV_RANK = str(SCRIPTS / "env_rank.py")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_local_ranks_get_launch_env_and_local_rank_arg(tmp_path, n):
    res = run_cli(["--num_procs", str(n), ENV_RANK, "--out", str(tmp_path), "user arg", "--flag"])
    assert res.returncode == 0, res.stderr
    recs = records(tmp_path)
    assert sorted(recs) == list(range(n))
    ports = {r["MASTER_PORT"] for r in recs.values()}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, r in recs.items():
        assert (r["RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"], r["LOCAL_WORLD_SIZE"]) == (
            str(rank),
            str(rank),
            str(n),
            str(n),
        )
        assert r["MASTER_ADDR"] == "127.0.0.1"
        # --local_rank goes before the user's arguments, which arrive untouched (no shell in between).
        assert r["argv"] == [f"--local_rank={rank}", "--out", str(tmp_path), "user arg", "--flag"]


def test_no_local_rank_and_explicit_master(tmp_path):
    res = run_cli(
        [
            "--num_procs",
            "2",
            "--no_local_rank",
            "--master_addr",
            "localhost",
            "--master_port",
            "29999",
            ENV_RANK,
            "--out",
            str(tmp_path),
            "$(touch pwned)",
        ]
    )
    assert res.returncode == 0, res.stderr
    for r in records(tmp_path).values():
        assert r["local_rank_arg"] is None
        assert r["rest"] == ["$(touch pwned)"]
        assert (r["MASTER_ADDR"], r["MASTER_PORT"]) == ("localhost", "29999")
    assert not (tmp_path / "pwned").exists()


def test_hostfile_include_selects_local_slots(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=4\n")
    out = tmp_path / "out"
    out.mkdir()
    res = run_cli(["-H", str(hostfile), "-i", "localhost:1,3", ENV_RANK, "--out", str(out)])
    assert res.returncode == 0, res.stderr
    recs = records(out)
    assert sorted(recs) == [0, 1]
    assert {r["CUDA_VISIBLE_DEVICES"] for r in recs.values()} in ({"1,3"}, {None})


@pytest.mark.parametrize(
    ("misbehaviour", "expected_code", "expected_text"),
    [
        (["--fail-rank", "1", "--code", "3"], 3, "rank 1 exited with code 3"),
        (["--kill-rank", "2"], 128 + 9, "rank 2 was killed by signal SIGKILL"),
    ],
)
def test_failing_rank_stops_the_job_and_leaves_no_process(
    tmp_path, misbehaviour, expected_code, expected_text
):
    marker = f"marker-{uuid.uuid4().hex}"
    res = run_cli(
        [
            "--num_procs",
            "3",
            "--grace",
            "1",
            ENV_RANK,
            "--out",
            str(tmp_path),
            "--sleep",
            "60",
            "--grandchild",
            *misbehaviour,
            marker,
        ],
        timeout_s=40,
    )
    assert res.returncode == expected_code, res.stderr
    assert expected_text in res.stderr
    assert wait_no_survivors(marker) == []


def test_rank_ignoring_sigterm_is_killed_after_grace_on_timeout(tmp_path):
    marker = f"marker-{uuid.uuid4().hex}"
    res = run_cli(
        [
            "--num_procs",
            "2",
            "--timeout",
            "3",
            "--grace",
            "0.5",
            ENV_RANK,
            "--out",
            str(tmp_path),
            "--sleep",
            "60",
            "--ignore-term",
            "--grandchild",
            marker,
        ],
        timeout_s=40,
    )
    assert res.returncode == 124, res.stderr
    assert "--timeout" in res.stderr
    assert wait_no_survivors(marker) == []


def _start_and_wait_for_ranks(tmp_path, n, extra, marker):
    proc = subprocess.Popen(
        [
            *DS_LAUNCH,
            "--num_procs",
            str(n),
            "--grace",
            "2",
            ENV_RANK,
            "--out",
            str(tmp_path),
            "--sleep",
            "60",
            *extra,
            marker,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while len(records(tmp_path)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(records(tmp_path)) == n
    return proc


def test_sigterm_to_launcher_reaches_every_rank(tmp_path):
    marker = f"marker-{uuid.uuid4().hex}"
    proc = _start_and_wait_for_ranks(tmp_path, 3, ["--trap-term"], marker)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert sorted(p.name for p in tmp_path.glob("term*")) == ["term0", "term1", "term2"]
    assert wait_no_survivors(marker) == []


def test_launcher_killed_with_sigkill_takes_its_ranks_along(tmp_path):
    marker = f"marker-{uuid.uuid4().hex}"
    proc = _start_and_wait_for_ranks(tmp_path, 2, [], marker)
    proc.kill()
    proc.wait(timeout=10)
    assert wait_no_survivors(marker) == []
