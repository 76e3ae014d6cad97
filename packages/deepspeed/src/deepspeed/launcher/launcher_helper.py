"""DeepSpeed's ``deepspeed.launcher.launcher_helper``: the per-rank helper of its mpich launcher.

ds's mpich launcher (``deepspeed.launcher.multinode_runner.MPICHRunner``) runs ds-launch, whose ranks find
their place through mpi4py: DeepSpeed's per-rank helper has no part in it, so this module's ``main`` and
``env_mapping`` raise ``FeatureNotAvailableError``, naming it.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ds_engine import FeatureNotAvailableError
from ds_engine._missing import missing_function

__all__ = ["env_mapping", "main", "parse_args"]


def _unavailable(name: str) -> NoReturn:
    raise FeatureNotAvailableError(
        f"deepspeed.launcher.launcher_helper.{name}: DeepSpeed's per-rank helper of its mpich launcher is not "
        "available in ds (ds's mpich launcher starts ranks through ds-launch); use deepspeed --launcher mpich"
    )


def env_mapping(env: Any, rank_name_list: Any = None, local_rank_name_list: Any = None) -> NoReturn:
    _unavailable("env_mapping")


def main(args: Any = None) -> NoReturn:
    _unavailable("main")


parse_args = missing_function(
    "deepspeed.launcher.launcher_helper",
    "parse_args",
    "the mpich launcher's per-rank helper",
    "Use deepspeed --launcher mpich (ds-launch starts the ranks).",
)
