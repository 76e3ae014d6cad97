"""Slurm: the ``srun`` command of ``--launcher slurm``, and rank 0's address for a script ``srun`` started.

``srun`` places tasks by count: ``-n`` ranks on the hosts named (``--nodelist``, ``--nodes``), as DeepSpeed's
Slurm runner asks for them, the environment passed with ``--export=ALL`` (srun's own environment). Each task learns its rank
from Slurm's variables (``_discovery``). A script started by ``srun`` directly, with no launcher to set
MASTER_ADDR and MASTER_PORT, rendezvouses at the first host of the step (where Slurm's block distribution
puts rank 0) on a port derived from the job and step ids, the same on every task.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence

__all__ = ["SlurmNotFound", "build_srun_command", "expand_hostlist", "slurm_master"]


class SlurmNotFound(RuntimeError):
    """``srun`` is not on PATH."""


def find_srun() -> str:
    found = shutil.which("srun")
    if found is None:
        raise SlurmNotFound("launcher 'slurm' needs srun on PATH (a Slurm client: apt install slurm-client)")
    return found


def build_srun_command(
    srun: str,
    active: Mapping[str, list[int]],
    program: Sequence[str],
    launcher_args: Sequence[str],
) -> list[str]:
    """``srun -n N --nodes H --nodelist h1,h2 --ntasks-per-node S --export=ALL program``: every host the
    same number of ranks (srun cannot place fewer on one host than on another, nor pick slots). The job's
    variables go in srun's own environment, which ``--export=ALL`` hands to every task: a value may hold
    commas (the monitor's addresses), which ``--export=K=V`` cannot carry."""
    counts = {host: len(slots) for host, slots in active.items()}
    if len(set(counts.values())) > 1:
        raise ValueError(f"the slurm launcher needs the same number of slots on every host, got {counts}")
    for host, slots in active.items():
        if list(slots) != list(range(len(slots))):
            raise ValueError(
                f"the slurm launcher cannot select slots {list(slots)} on {host}: srun places ranks by count; "
                "select whole hosts, or the first N slots of each"
            )
    per_host = next(iter(counts.values()))
    return [srun, "-n", str(per_host * len(active)), "--nodes", str(len(active)),
            "--nodelist", ",".join(active), "--ntasks-per-node", str(per_host), *launcher_args,
            "--export=ALL", *program]  # fmt: skip


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list, e.g. ``node[0-2,5],gpu01`` -> node0 node1 node2 node5 gpu01."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if match is None:
            hosts.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            bounds = _RANGE.match(item)
            if bounds is None:
                raise ValueError(f"cannot read Slurm host list {hostlist!r} (range {item!r})")
            first, last = bounds.group(1), bounds.group(2) or bounds.group(1)
            for n in range(int(first), int(last) + 1):
                hosts.append(f"{prefix}{str(n).zfill(len(first))}{suffix}")
    return hosts


def slurm_master(env: Mapping[str, str]) -> tuple[str, int] | None:
    """Rank 0's host and a port for a script started by ``srun`` directly; None outside a Slurm step.

    The port is 15000 + the job id's last four digits (Lightning's choice, so that a job's steps on the
    same hosts do not collide with each other's stores unless they overlap in time), plus the step id."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not nodelist or not job or not job.isdigit():
        return None
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "0"
    port = 15000 + int(job[-4:]) + (int(step) if step.isdigit() else 0)
    return expand_hostlist(nodelist)[0], min(port, 65535)
