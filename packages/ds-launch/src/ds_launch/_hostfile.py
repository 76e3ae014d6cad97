"""Hostfiles (``hostname slots=N``) and the include/exclude resource filter, DeepSpeed's rules.

A *resource pool* maps each host, in hostfile order, to its slot count; *active resources* map each
host to the list of slot ids that will run a rank. Errors keep DeepSpeed's texts (so users can search
for them) and add the file, line number and the offending line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "HostfileError",
    "parse_hostfile",
    "parse_hostfile_lines",
    "parse_node_specs",
    "filter_resources",
    "limit_resources",
    "select_resources",
]

# DeepSpeed V14's pattern, anchored at the end of the slot count so that "slots=4x" is rejected
# instead of silently read as 4; OpenMPI-style trailing fields ("max_slots=8") are still allowed.
_ENTRY = re.compile(r"^(\S+)\s+slots=(\d+)(?:\s|$)")

NODE_SEP = "@"
SLOT_LIST_START = ":"
SLOT_SEP = ","


class HostfileError(ValueError):
    """A hostfile or an include/exclude/num_nodes/num_procs selection that cannot be launched."""


def parse_hostfile(path: str | Path) -> dict[str, int]:
    """Read a hostfile into ``{host: slots}`` in file order; raises :class:`HostfileError`."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise HostfileError(f"Hostfile {path} does not exist; pass an existing file to --hostfile") from None
    return parse_hostfile_lines(text.splitlines(), source=str(path))


def parse_hostfile_lines(lines: Iterable[str], source: str = "<hostfile>") -> dict[str, int]:
    """Parse hostfile lines: ``host slots=N``; ``#`` comments and blank lines are skipped."""
    pool: dict[str, int] = {}
    first_line: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _ENTRY.match(line)
        if match is None:
            raise HostfileError(
                f"Hostfile contains a bad entry: {line}, unable to proceed with launching ({source} line "
                f"{number}; every line must read 'HOSTNAME slots=N')"
            )
        host, slots = match.group(1), int(match.group(2))
        if host in pool:
            raise HostfileError(
                f"Hostfile contains multiple entries for {host}, unable to proceed with launching ({source} "
                f"lines {first_line[host]} and {number}: {line!r}; keep one line per host)"
            )
        pool[host] = slots
        first_line[host] = number
    if not pool:
        raise HostfileError(
            f"Hostfile is empty or not formatted correctly, unable to proceed with launching. ({source} has "
            "no 'HOSTNAME slots=N' line)"
        )
    return pool


def _parse_slots(text: str, node_config: str) -> list[int]:
    try:
        return [int(s) for s in text.split(SLOT_SEP)]
    except ValueError:
        raise HostfileError(
            f"Bad slot list in {node_config!r}: slots are integers separated by ',' (e.g. 'worker-0:0,2')"
        ) from None


def parse_node_specs(spec: str) -> list[tuple[str, list[int] | None]]:
    """``NODE[:SLOT[,SLOT...]][@NODE...]`` -> ``[(host, slots)]`` in the order given; slots None: the whole
    host. Hosts are not checked here (see :func:`filter_resources`)."""
    parsed = []
    for node_config in spec.split(NODE_SEP):
        hostname, has_slots, slot_text = node_config.partition(SLOT_LIST_START)
        parsed.append((hostname, _parse_slots(slot_text, node_config) if has_slots else None))
    return parsed


def filter_resources(
    host_info: dict[str, list[int]], include_str: str = "", exclude_str: str = ""
) -> dict[str, list[int]]:
    """Apply ``--include``/``--exclude`` (``NODE[:SLOT[,SLOT...]][@NODE...]``) to ``{host: slots}``.

    Include builds the selection from scratch, exclude removes from everything; a host named without
    slots means the whole host. Slots come back sorted without duplicates, hosts left without slots
    are dropped, and hostfile order is kept (it fixes the global rank order).
    """
    if include_str and exclude_str:
        raise HostfileError("include_str and exclude_str are mutually exclusive.")
    if not include_str and not exclude_str:
        return {host: list(slots) for host, slots in host_info.items()}

    spec = include_str or exclude_str
    chosen: dict[str, set[int]] = {} if include_str else {h: set(s) for h, s in host_info.items()}
    for hostname, listed in parse_node_specs(spec):
        if hostname not in host_info:
            raise HostfileError(f"Hostname '{hostname}' not found in hostfile (in {spec!r})")
        slots = set(host_info[hostname] if listed is None else listed)
        for slot in slots:
            if slot not in host_info[hostname]:
                raise HostfileError(f"No slot '{slot}' specified on host '{hostname}' (in {spec!r})")
        if include_str:
            # Unlike DeepSpeed, naming a host twice adds up instead of keeping only the last mention.
            chosen.setdefault(hostname, set()).update(slots)
        else:
            chosen[hostname] -= slots
    return {host: sorted(chosen[host]) for host in host_info if chosen.get(host)}


def limit_resources(
    active: dict[str, list[int]], num_nodes: int = -1, num_procs: int = -1
) -> dict[str, list[int]]:
    """``--num_nodes``: the first N hosts; ``--num_procs`` (``--num_gpus``): slots 0..N-1 on each."""
    if num_nodes > 0:
        if num_nodes > len(active):
            raise HostfileError(
                f"--num_nodes {num_nodes} asks for more hosts than the {len(active)} available"
            )
        active = dict(list(active.items())[:num_nodes])
    if num_procs > 0:
        active = {host: list(range(num_procs)) for host in active}
    return active


def select_resources(
    pool: dict[str, int],
    include: str = "",
    exclude: str = "",
    num_nodes: int = -1,
    num_procs: int = -1,
    have_hostfile: bool = True,
) -> dict[str, list[int]]:
    """The runner's whole selection: include/exclude, then ``--num_nodes``, then ``--num_procs``."""
    if (include or exclude) and (num_nodes >= 0 or num_procs >= 0):
        raise HostfileError("Cannot specify num_nodes/gpus with include/exclude")
    if not have_hostfile and num_nodes > 1:
        raise HostfileError("Num nodes is >1 but no extra nodes available via hostfile")
    for name, value in (("--num_nodes", num_nodes), ("--num_procs", num_procs)):
        if value == 0 or value < -1:
            raise HostfileError(f"{name} must be a positive number (got {value})")
    active = filter_resources({h: list(range(n)) for h, n in pool.items()}, include, exclude)
    active = limit_resources(active, num_nodes, num_procs)
    if not active:
        raise HostfileError("No slots left to launch on after applying include/exclude")
    return active
