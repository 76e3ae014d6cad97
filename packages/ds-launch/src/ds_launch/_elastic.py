"""``ds-launch --elastic``: a job that loses a host goes on, on the hosts it still has.

Each attempt runs the job (ssh or pdsh launcher) on the hostfile's hosts that answer the remote shell at that
moment, so a host that was lost and came back is taken back at the next restart. When an attempt fails and a
host of it no longer answers, the job is restarted on the hosts that do, at their world size; a failure with
every host still answering is the script's own and ends the job with its code. The script resumes from its
latest checkpoint (ds loads a checkpoint at any world size) and, with the config's ``elasticity`` section,
trains at the same global batch: micro batch and accumulation steps follow the new world size. Each restart
is reported: the hosts lost, the world size before and after, the latest checkpoint
(``--elastic_checkpoint_dir``'s ``latest`` file). Every attempt's ranks see ``DS_ELASTIC_RESTART`` (0, 1, ...).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["ELASTIC_RESTART_ENV", "reachable_hosts", "run_elastic"]

ELASTIC_RESTART_ENV = "DS_ELASTIC_RESTART"
_PROBE_TIMEOUT_S = 10.0


def reachable_hosts(rsh: Sequence[str], hosts: Sequence[str]) -> list[str]:
    """The hosts that run ``true`` through the remote shell now, in the given order (probed side by side)."""
    probes = {h: subprocess.Popen([*rsh, h, "true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for h in hosts}  # fmt: skip
    deadline = time.monotonic() + _PROBE_TIMEOUT_S
    alive = []
    for host, probe in probes.items():
        try:
            ok = probe.wait(max(0.1, deadline - time.monotonic())) == 0
        except subprocess.TimeoutExpired:
            probe.kill()
            probe.wait()
            ok = False
        if ok:
            alive.append(host)
    return alive


def _latest(checkpoint_dir: str) -> str:
    if not checkpoint_dir:
        return "the script's latest checkpoint"
    latest = Path(checkpoint_dir) / "latest"
    return (
        f"checkpoint {latest.read_text().strip()}"
        if latest.is_file()
        else "no checkpoint yet (from the start)"
    )


def _say(message: str) -> None:
    print(f"ds-launch --elastic: {message}", file=sys.stderr, flush=True)


def run_elastic(
    rsh: Sequence[str],
    pool: Mapping[str, list[int]],
    attempt: Callable[[dict[str, list[int]], int], int],
    min_nodes: int,
    max_restarts: int,
    checkpoint_dir: str = "",
) -> int:
    """Run ``attempt(hosts, restart)`` until it succeeds, restarting on the reachable hosts after a host is
    lost (at most ``max_restarts`` times, never on fewer than ``min_nodes`` hosts)."""
    restart = 0
    while True:
        alive = reachable_hosts(rsh, list(pool))
        if len(alive) < min_nodes:
            _say(f"{len(alive)} of {len(pool)} hosts answer ({', '.join(alive) or 'none'}), fewer than --min_nodes "
                 f"{min_nodes}: the job ends")  # fmt: skip
            return 1
        hosts = {h: pool[h] for h in alive}
        world = sum(len(s) for s in hosts.values())
        if restart:
            _say(
                f"restart {restart} on {', '.join(hosts)}: world size {world}, from {_latest(checkpoint_dir)}"
            )
        started = time.monotonic()
        code = attempt(hosts, restart)
        if code == 0:
            return 0
        lost = [h for h in hosts if h not in reachable_hosts(rsh, list(hosts))]
        if not lost:
            return code  # every host answers: the script failed on its own
        left = {h: s for h, s in hosts.items() if h not in lost}
        after = sum(len(s) for s in left.values())
        _say(f"host{'s' if len(lost) > 1 else ''} {', '.join(lost)} lost after {time.monotonic() - started:.0f} s "
             f"of attempt {restart}; world size {world} -> {after} (and any host that answers again); latest: "
             f"{_latest(checkpoint_dir)}")  # fmt: skip
        if restart >= max_restarts:
            _say(f"--max_restarts {max_restarts} reached: the job ends with code {code}")
            return code
        restart += 1
