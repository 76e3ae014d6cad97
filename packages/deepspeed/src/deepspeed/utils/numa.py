"""DeepSpeed's ``deepspeed.utils.numa``: the core-range parsing the launcher's ``--bind_core_list`` takes.

The parsing is ds-launch's (one implementation: its ``--bind_core_list`` uses it; errors are ValueErrors with
DeepSpeed's texts). ds-launch binds ranks to cores with taskset (``--bind_cores_to_rank``), not with
``numactl`` (no NUMA memory binding): ``get_numactl_cmd``, ``get_numa_cores`` and ``check_for_numactl_pkg``
fail at use, naming it.
"""

from __future__ import annotations

from ds_engine._missing import missing_function
from ds_launch import parse_range, parse_range_list

__all__ = ["check_for_numactl_pkg", "get_numa_cores", "get_numactl_cmd", "parse_range", "parse_range_list"]


_FEATURE = "binding ranks to CPU cores with numactl (DeepSpeed's --bind_cores_to_rank)"
_INSTEAD = (
    "ds-launch --bind_cores_to_rank binds cores with taskset; wrap the command in numactl for memory binding."
)
get_numactl_cmd = missing_function(__name__, "get_numactl_cmd", _FEATURE, _INSTEAD)
get_numa_cores = missing_function(__name__, "get_numa_cores", _FEATURE, _INSTEAD)
check_for_numactl_pkg = missing_function(__name__, "check_for_numactl_pkg", _FEATURE, _INSTEAD)
