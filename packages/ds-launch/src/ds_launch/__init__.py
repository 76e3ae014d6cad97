"""The ds-launch CLI, rank discovery under mpirun (mpi4py), hostfiles, clean failure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._binding import parse_range, parse_range_list
from ._discovery import LaunchEnvError, discover_from_env
from ._excepthook import install_excepthook
from ._heartbeat import set_rank_role
from ._hostfile import (
    HostfileError,
    filter_resources,
    limit_resources,
    parse_hostfile,
    parse_hostfile_lines,
    parse_node_specs,
    select_resources,
)
from ._ssh import decode_world_info, encode_world_info
from ._supervise import terminate_process_tree
from ._topology import Topology

if TYPE_CHECKING:
    from ._distributed import init_distributed

__version__ = "0.1.0"
__all__ = [
    "__version__",
    "HostfileError",
    "LaunchEnvError",
    "Topology",
    "decode_world_info",
    "discover_from_env",
    "encode_world_info",
    "filter_resources",
    "limit_resources",
    "parse_node_specs",
    "init_distributed",
    "install_excepthook",
    "parse_hostfile",
    "parse_hostfile_lines",
    "parse_range",
    "parse_range_list",
    "select_resources",
    "set_rank_role",
    "terminate_process_tree",
]


def __getattr__(name: str) -> Any:
    # init_distributed needs torch (seconds to import); the launcher CLI and hostfile tools do not.
    if name == "init_distributed":
        from ._distributed import init_distributed

        return init_distributed
    raise AttributeError(f"module 'ds_launch' has no attribute {name!r}")
