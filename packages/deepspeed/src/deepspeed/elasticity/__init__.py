"""DeepSpeed's ``deepspeed.elasticity``: the elastic batch computation, mapped onto ``ds_config``'s.

DeepSpeed 0.19.8 removed elastic training (its config refuses the ``elasticity`` section); ds keeps it, with
the answers of DeepSpeed 0.14.4, the last release that computes it (compared over a grid of inputs:
packages/deepspeed/tests/test_elasticity.py). ``ds-launch --elastic`` restarts a job on the hosts it has.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ds_config._elasticity import (
    ElasticityConfig,
    ElasticityConfigError,
    ElasticityError,
    ElasticityIncompatibleWorldSize,
    compute_elastic_config,
)

__all__ = [
    "ElasticityConfig",
    "ElasticityConfigError",
    "ElasticityError",
    "ElasticityIncompatibleWorldSize",
    "compute_elastic_config",
    "elasticity_enabled",
    "ensure_immutable_elastic_config",
]

DEEPSPEED_ELASTICITY_CONFIG = "DEEPSPEED_ELASTICITY_CONFIG"


def elasticity_enabled(ds_config: dict) -> bool:
    return bool(ds_config.get("elasticity", {}).get("enabled", False))


def ensure_immutable_elastic_config(runtime_elastic_config_dict: dict) -> None:
    """The scheduler's elastic section (``DEEPSPEED_ELASTICITY_CONFIG``) must match the runtime's in its
    maximum batch, micro batches and version (DeepSpeed's check and words)."""
    if DEEPSPEED_ELASTICITY_CONFIG not in os.environ:
        return
    seen: dict[str, Any] = {
        **ElasticityConfig().model_dump(),
        **json.loads(os.environ[DEEPSPEED_ELASTICITY_CONFIG]),
    }
    ours: dict[str, Any] = {**ElasticityConfig().model_dump(), **runtime_elastic_config_dict}
    for key, name in (("max_train_batch_size", "max_acceptable_batch_size"), ("micro_batch_sizes", "micro_batches"),
                      ("version", "version")):  # fmt: skip
        if seen[key] != ours[key]:
            raise ElasticityConfigError(
                f"Elastic config '{name}={seen[key]}' seen by resource scheduler does not match config passed "
                f"to runtime {name}={ours[key]}"
            )
