"""The process groups of ZeRO++ (hpZ, qgZ), made from the launcher's ranks per host.

Hosts hold consecutive global ranks (every launcher ds supports places them so), ``local_world_size`` of
them each. ZeRO++ runs on the plain data-parallel world (DeepSpeed's too): with model parallelism the
data-parallel ranks of one host are not consecutive, and ds refuses the combination rather than guess.
Every rank creates every group, in the same order (``new_group`` is collective).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from ds_config import DSConfig
from ds_zero.stage3 import HostGroups

from ._missing import FeatureNotAvailableError

__all__ = ["zeropp_host_groups"]


def zeropp_host_groups(
    cfg: DSConfig, dp_group: Any, world: int, rank: int, local_world_size: int
) -> HostGroups | None:
    """The groups the ZeRO++ keys in ``cfg`` need (None when none is set or the world is one rank)."""
    zero = cfg.zero_optimization
    hpz, qgz = int(zero.zero_hpz_partition_size), bool(zero.zero_quantized_gradients)
    if (hpz <= 1 and not qgz) or world <= 1:
        return None
    if dp_group is not None and dist.get_world_size(dp_group) != world:
        raise FeatureNotAvailableError(
            "zero_hpz_partition_size / zero_quantized_gradients with model parallelism (an mpu): ds builds "
            "ZeRO++'s host groups on the plain data-parallel world only; remove the ZeRO++ keys or the mpu"
        )
    out: dict[str, Any] = {}
    if hpz > 1:
        if world % hpz or local_world_size % hpz:
            raise FeatureNotAvailableError(
                f"zero_hpz_partition_size {hpz} must divide the ranks per host ({local_world_size}) and the "
                f"world ({world}): a secondary partition lives inside one host"
            )
        out["hpz"] = _mine([list(range(s, s + hpz)) for s in range(0, world, hpz)], rank)
    if qgz:
        lws = local_world_size
        if lws < 1 or world % lws:
            raise FeatureNotAvailableError(
                f"zero_quantized_gradients: the world ({world}) is not a whole number of hosts of "
                f"{lws} ranks (LOCAL_WORLD_SIZE from the launcher)"
            )
        out["local"] = _mine([list(range(s, s + lws)) for s in range(0, world, lws)], rank)
        out["cross"] = _mine([list(range(j, world, lws)) for j in range(lws)], rank)
    return HostGroups(**out)


def _mine(members: list[list[int]], rank: int) -> Any:
    """Create every group of ``members`` (on every rank) and return the one holding ``rank``."""
    groups = [dist.new_group(m) for m in members]
    return next(g for g, m in zip(groups, members) if rank in m)
