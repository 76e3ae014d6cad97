"""DeepSpeed's ``deepspeed.utils.numa``: the core-range parsing the launcher's ``--bind_core_list`` takes.

Binding ranks to CPU cores with ``numactl`` (DeepSpeed's ``--bind_cores_to_rank``) is not in ds:
``get_numactl_cmd``, ``get_numa_cores`` and ``check_for_numactl_pkg`` fail at use, naming it.
"""

from __future__ import annotations

from ds_engine._missing import missing_function

__all__ = ["check_for_numactl_pkg", "get_numa_cores", "get_numactl_cmd", "parse_range", "parse_range_list"]


def parse_range(rng: str) -> range:
    """``"3"`` -> ``range(3, 4)``; ``"2-5"`` -> ``range(2, 6)`` (inclusive). ValueError on anything else."""
    try:
        value = int(rng)
    except ValueError:
        pieces = rng.split("-")
        if len(pieces) != 2:
            raise ValueError(
                f"Bad range: {rng!r}: a range is one number or two numbers joined by a dash"
            ) from None
        start, end = int(pieces[0]), int(pieces[1])
        if start > end:
            raise ValueError(f"Bad range: {rng!r}: the end must not be smaller than the start") from None
        return range(start, end + 1)
    return range(value, value + 1)


def parse_range_list(range_str: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]``: comma-separated ranges, ascending, not overlapping."""
    numbers: list[int] = []
    for piece in range_str.split(","):
        sub = parse_range(piece)
        if numbers and sub[0] <= numbers[-1]:
            raise ValueError(f"Bad range: {range_str!r}: sub-ranges must be ascending and must not overlap")
        numbers.extend(sub)
    return numbers


_FEATURE = "binding ranks to CPU cores with numactl (DeepSpeed's --bind_cores_to_rank)"
_INSTEAD = "Launch without core binding, or wrap the command in numactl yourself."
get_numactl_cmd = missing_function(__name__, "get_numactl_cmd", _FEATURE, _INSTEAD)
get_numa_cores = missing_function(__name__, "get_numa_cores", _FEATURE, _INSTEAD)
check_for_numactl_pkg = missing_function(__name__, "check_for_numactl_pkg", _FEATURE, _INSTEAD)
