"""DeepSpeed's ``deepspeed.launcher.launcher_helper``: the per-rank helper of its mpich launcher.

ds has no mpich launcher (``deepspeed.launcher.multinode_runner.MPICHRunner`` raises
``FeatureNotAvailableError``), so this module's ``main`` and ``env_mapping`` raise it too, naming the feature.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ds_engine import FeatureNotAvailableError
from ds_engine._missing import missing_function

__all__ = ["env_mapping", "main", "parse_args"]


def _unavailable(name: str) -> NoReturn:
    raise FeatureNotAvailableError(
        f"deepspeed.launcher.launcher_helper.{name}: the mpich launcher is not available in ds (DeepSpeed has it, "
        "ds does not); use --launcher pdsh (pdsh or ssh) or --launcher openmpi"
    )


def env_mapping(env: Any, rank_name_list: Any = None, local_rank_name_list: Any = None) -> NoReturn:
    _unavailable("env_mapping")


def main(args: Any = None) -> NoReturn:
    _unavailable("main")


parse_args = missing_function(
    "deepspeed.launcher.launcher_helper",
    "parse_args",
    "the mpich launcher's per-rank helper",
    "Use --launcher pdsh (pdsh or ssh) or --launcher openmpi.",
)
