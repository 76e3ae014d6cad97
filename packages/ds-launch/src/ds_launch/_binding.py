"""``--bind_cores_to_rank``: each rank of a host on its own share of the host's cores (DeepSpeed's rule).

The cores (``--bind_core_list`` in DeepSpeed's syntax, ``1,3-5,7``; else every core this launcher may run on)
are split evenly, in order, among the host's ranks; each rank starts under ``taskset -c <its cores>`` with
``OMP_NUM_THREADS`` set to its share. DeepSpeed binds with ``numactl -C`` and also binds memory to the NUMA
node of those cores (``-m``) and counts physical cores; ds binds cores only and counts the logical cores in
its affinity mask.
"""

from __future__ import annotations

import os
import shutil

from ._hostfile import HostfileError

__all__ = ["parse_range", "parse_range_list", "cores_per_rank", "bound_argv"]


def parse_range(rng: str) -> range:
    """``"3"`` -> ``range(3, 4)``; ``"2-5"`` -> ``range(2, 6)`` (inclusive); HostfileError (a ValueError) otherwise."""
    if rng.strip().isdigit():
        value = int(rng)
        return range(value, value + 1)
    parts = rng.split("-")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise HostfileError(
            f"Bad range: '{rng}', range must be either a number or two number separated by dash"
        )
    start, end = int(parts[0]), int(parts[1])
    if start > end:
        raise HostfileError(f"Bad range: '{rng}', range end must larger than or equal to start")
    return range(start, end + 1)


def parse_range_list(range_str: str) -> list[int]:
    """``"1,3-5,7"`` -> ``[1, 3, 4, 5, 7]``; ranges ascend and do not overlap (DeepSpeed's rules and texts)."""
    cores: list[int] = []
    for part in range_str.split(","):
        sub = parse_range(part)
        if cores and sub[0] <= cores[-1]:
            raise HostfileError(
                f"Bad range: '{range_str}', sub ranges must not overlap with each other and should be in ascend order"
            )
        cores.extend(sub)
    return cores


def cores_per_rank(
    num_local: int, core_list: str | None, env: dict[str, str] | os._Environ
) -> list[list[int]]:
    """Each local rank's cores, in local-rank order."""
    if "KMP_AFFINITY" in env:
        raise HostfileError(
            "Environment variable KMP_AFFINITY conflicts with binding cores to ranks; unset KMP_AFFINITY first"
        )
    cores = parse_range_list(core_list) if core_list else sorted(os.sched_getaffinity(0))
    share = len(cores) // num_local
    if share < 1:
        raise HostfileError(
            f"At least one core needs to be assigned to each rank: {len(cores)} core(s) for {num_local} ranks"
        )
    return [cores[i * share : (i + 1) * share] for i in range(num_local)]


def bound_argv(cores: list[int], argv: list[str]) -> list[str]:
    """``argv`` started on ``cores`` only."""
    taskset = shutil.which("taskset")
    if taskset is None:
        raise HostfileError("--bind_cores_to_rank needs taskset (util-linux), which is not on PATH")
    return [taskset, "-c", ",".join(map(str, cores)), *argv]
