"""DeepSpeed's ``deepspeed.launcher.launcher_helper``: the per-rank helper of its mpich launcher.

ds's mpich launcher (``deepspeed.launcher.multinode_runner.MPICHRunner``) runs ds-launch, whose ranks find
their place through mpi4py: DeepSpeed's per-rank helper has no part in it, so this module's names are not
available (each raises ``FeatureNotAvailableError``, naming it).
"""

from __future__ import annotations

from ds_engine._missing import missing_function

__all__ = ["env_mapping", "main", "parse_args"]

_FEATURE = "DeepSpeed's per-rank helper of its mpich launcher"
_INSTEAD = "ds's mpich launcher starts ranks through ds-launch: use deepspeed --launcher mpich."
env_mapping = missing_function(__name__, "env_mapping", _FEATURE, _INSTEAD)
main = missing_function(__name__, "main", _FEATURE, _INSTEAD)
parse_args = missing_function(__name__, "parse_args", _FEATURE, _INSTEAD)
