"""``--elastic``'s restarts (``_elastic.run_elastic``) with a remote shell that fails for the hosts marked down:
a lost host is dropped at the next attempt, a returning one taken back, a script failure ends the job.
integration/test_elastic.py runs a real job across namespace hosts."""

from __future__ import annotations

import os
from pathlib import Path

from ds_launch._elastic import run_elastic


def _rsh(tmp_path: Path) -> list[str]:
    script = tmp_path / "rsh"
    script.write_text(f'#!/bin/sh\n[ -e "{tmp_path}/down-$1" ] && exit 255\nexit 0\n')
    script.chmod(0o755)
    return [str(script)]


def test_a_lost_host_is_dropped_and_taken_back_when_it_returns(tmp_path, capsys):
    pool = {"a": [0], "b": [0], "c": [0]}
    seen = []

    def attempt(hosts, restart):
        seen.append((list(hosts), restart))
        if restart == 0:
            (tmp_path / "down-c").touch()  # c is lost during the first attempt
            return 1
        if restart == 1:
            os.remove(tmp_path / "down-c")  # c is back, and b is lost
            (tmp_path / "down-b").touch()
            return 1
        return 0

    assert run_elastic(_rsh(tmp_path), pool, attempt, min_nodes=1, max_restarts=3) == 0
    assert seen == [(["a", "b", "c"], 0), (["a", "b"], 1), (["a", "c"], 2)]
    err = capsys.readouterr().err
    assert "host c lost after" in err and "world size 3 -> 2" in err
    assert "restart 2 on a, c: world size 2" in err


def test_a_script_failure_with_every_host_up_ends_the_job(tmp_path):
    calls = []
    code = run_elastic(_rsh(tmp_path), {"a": [0], "b": [0]}, lambda h, r: calls.append(r) or 7, 1, 3)
    assert (code, calls) == (7, [0])


def test_too_few_hosts_end_the_job(tmp_path):
    (tmp_path / "down-b").touch()
    assert run_elastic(_rsh(tmp_path), {"a": [0], "b": [0]}, lambda h, r: 0, min_nodes=2, max_restarts=3) == 1
