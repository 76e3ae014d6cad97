"""``elasticity``: DeepSpeed's elastic batch sizing, the same answers as DeepSpeed's ``compute_elastic_config``.

The section fixes a global batch that many world sizes can train with: micro batch x accumulation steps x
data-parallel ranks, for every rank count in ``valid_gpus``. So a job restarted on fewer (or more) hosts
after a loss goes on at the same global batch and the loss curve continues (``ds-launch --elastic``).

How the batch is chosen (DeepSpeed's v0.1 and v0.2 rules; DeepSpeed 0.14.4 is the last release that has them,
0.19.8 refuses the section, ds keeps it; answers compared over a grid in packages/deepspeed/tests):

- candidates: each micro batch and their least common multiple, scaled by the largest highly composite
  number that keeps it within ``max_train_batch_size`` (a base already above it stays as it is);
- a candidate's valid rank counts: for each micro batch dividing it, ``n = batch // micro`` and each divisor
  of ``n`` up to ``n // 2``, within ``[min_gpus, max_gpus]``;
- the candidate with the most valid counts wins; a tie goes to the larger batch (``prefer_larger_batch``)
  or the smaller;
- v0.2 works per node (``num_gpus_per_node``, ``model_parallel_size``) and, for a world size outside the
  valid counts, falls back to the largest (or smallest) multiple of ``micro * data-parallel ranks`` within
  the maximum;
- for a world size: the largest micro batch dividing ``batch // world``; accumulation = batch // (micro x
  world).
"""

from __future__ import annotations

import math
import os
from functools import reduce
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ElasticityConfig",
    "ElasticityConfigError",
    "ElasticityError",
    "ElasticityIncompatibleWorldSize",
    "compute_elastic_config",
    "elastic_batch",
]

LATEST_VERSION = 0.2
MINIMUM_DEEPSPEED_VERSION = "0.3.8"
# highly composite numbers (more divisors than any smaller number), up to the largest DeepSpeed scales by
_HCN = (1, 2, 4, 6, 12, 24, 36, 48, 60, 120, 180, 240, 360, 720, 840, 1260, 1680, 2520, 5040, 7560, 10080,
        15120, 20160, 25200, 27720, 45360, 50400, 55440, 83160, 110880, 166320, 221760, 277200, 332640,
        498960, 554400, 665280, 720720)  # fmt: skip


class ElasticityError(Exception):
    """Base of the elasticity errors (DeepSpeed's class names)."""


class ElasticityConfigError(ElasticityError):
    """The elasticity section is wrong or missing."""


class ElasticityIncompatibleWorldSize(ElasticityError):
    """The world size is not one the elastic batch can be trained at."""


class ElasticityConfig(BaseModel):
    """DeepSpeed's ``elasticity`` keys and defaults (its checks run in :func:`compute_elastic_config`)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        False, description="Compute the batch sizes from this section (ds-launch --elastic)."
    )
    max_train_batch_size: int = Field(2000, description="The largest acceptable global batch.")
    micro_batch_sizes: list[int] = Field(
        default_factory=lambda: [2, 4, 6], description="Micro batches a rank may run."
    )
    min_gpus: int = Field(1, description="Fewest data-parallel ranks the batch must suit.")
    max_gpus: int = Field(10000, description="Most data-parallel ranks the batch must suit.")
    min_time: int = Field(
        0, description="A scheduler's hint (minutes a job runs before it is rescaled); no effect in a run."
    )
    version: float = Field(LATEST_VERSION, description="The rules: 0.1, or 0.2 (per node, model parallel).")
    prefer_larger_batch: bool = Field(True, description="On a tie, the larger global batch.")
    ignore_non_elastic_batch_info: bool = Field(
        False, description="Let train_batch_size / micro batch / accumulation in the config be overridden."
    )
    num_gpus_per_node: int = Field(1, description="v0.2: ranks per node.")
    model_parallel_size: int = Field(1, description="v0.2: model-parallel degree.")


def _check(section: dict[str, Any]) -> dict[str, Any]:
    """DeepSpeed's checks of the section, in its order and words; the section with its defaults."""
    s = dict(section)
    if s.get("enabled", False):
        for key in ("max_train_batch_size", "micro_batch_sizes"):
            if key not in s:
                raise ElasticityConfigError(f"Elasticity config missing {key}")
    defaults = ElasticityConfig().model_dump()
    s = {**defaults, **s}
    mbs = s["micro_batch_sizes"]
    if not isinstance(mbs, list):
        raise ElasticityConfigError(
            "Elasticity expected value of micro_batch_sizes to be a list of micro batches, instead is: "
            f"{type(mbs)}, containing: {mbs}"
        )
    if not all(isinstance(m, int) for m in mbs):
        raise ElasticityConfigError(
            f"Elasticity expected micro_batch_sizes to only contain a list of integers, instead contains: f{mbs}"
        )
    if not all(m > 0 for m in mbs):
        raise ElasticityConfigError(
            f"Elasticity expected micro_batch_sizes to only contain positive integers, instead contains: f{mbs}"
        )
    if s["min_gpus"] < 1 or s["max_gpus"] < 1:
        raise ElasticityConfigError(
            f"Elasticity min/max gpus must be > 0, given min_gpus: {s['min_gpus']}, max_gpus: {s['max_gpus']}"
        )
    if s["max_gpus"] < s["min_gpus"]:
        raise ElasticityConfigError(
            "Elasticity min_gpus cannot be greater than max_gpus, "
            f"given min_gpus: {s['min_gpus']}, max_gpus: {s['max_gpus']}"
        )
    if s["model_parallel_size"] < 1:
        raise ElasticityConfigError(
            f"Model-Parallel size cannot be less than 1, given model-parallel size: {s['model_parallel_size']}"
        )
    if s["num_gpus_per_node"] < 1:
        raise ElasticityConfigError(
            f"Number of GPUs per node cannot be less than 1, given number of GPUs per node: {s['num_gpus_per_node']}"
        )
    if s["min_time"] < 0:
        raise ElasticityConfigError(f"Elasticity min time needs to be >= 0: given {s['min_time']}")
    return s


def _scaled(base: int, limit: int) -> int:
    """``base`` times the largest highly composite number keeping it within ``limit``."""
    if base >= limit:
        return base
    room = limit // base
    fitting = [h for h in _HCN if h <= room]
    return (fitting[-1] if len(fitting) < len(_HCN) else _HCN[-1]) * base


def _rank_counts(batch: int, micros: list[int], low: int, high: int) -> list[int]:
    counts: set[int] = set()
    for micro in micros:
        if batch % micro:
            continue
        most = batch // micro
        if low <= most <= high:
            counts.add(most)
        counts.update(i for i in range(max(low, 1), min(high, most // 2) + 1) if most % i == 0)
    return sorted(counts)


def _v01(
    micros: list[int], limit: int, low: int, high: int, prefer_larger: bool
) -> tuple[int, list[int] | None]:
    low = low or 1
    high = high or limit // min(micros)
    if any(m > limit for m in micros):
        raise ValueError(
            f"All micro batches must be less than             or equal to max_acceptable_batch_size: {limit}"
        )
    lcm = reduce(lambda a, b: a * b // math.gcd(a, b), micros)
    best, best_counts, best_n = int(min(micros)), None, 0
    for batch in {_scaled(base, limit) for base in [*micros, lcm]}:
        counts = _rank_counts(batch, micros, low, high)
        better_tie = batch > best if prefer_larger else batch < best
        if len(counts) > best_n or (len(counts) == best_n and better_tie):
            best, best_counts, best_n = batch, counts, len(counts)
    return best, best_counts


def _v02(s: dict[str, Any], current: int) -> tuple[float, list[int], int | None]:
    micros, per_node, mp = s["micro_batch_sizes"], s["num_gpus_per_node"], s["model_parallel_size"]
    if per_node % mp:
        raise ElasticityError(
            f"In Elasticity v0.2, number of GPUs per node:{per_node} should be divisible by model parallel size {mp}"
        )

    def micro_for(batch: float) -> int | None:
        fits = [m for m in micros if batch // current % m == 0]
        if not fits:
            return None
        return max(fits) if s["prefer_larger_batch"] else fits[0]

    dp_per_node = per_node // mp
    batch, nodes = _v01(micros, int(s["max_train_batch_size"] / dp_per_node), int(s["min_gpus"] / per_node),
                        int(s["max_gpus"] / per_node), s["prefer_larger_batch"])  # fmt: skip
    batch = int(batch) * dp_per_node
    valid = [n * dp_per_node for n in nodes or []]
    if current // mp in valid:
        return batch, valid, micro_for(batch)
    dp = (current / per_node) * dp_per_node
    sizes = [math.floor(s["max_train_batch_size"] / float(m * dp)) * (m * dp) for m in micros]
    chosen = max(sizes) if s["prefer_larger_batch"] else min(sizes)
    return chosen, [int(dp)], micro_for(chosen)


def _version_ok(target: str) -> None:
    def parts(v: str) -> tuple[int, ...]:
        return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in v.split(".")[:3])

    if parts(target) < parts(MINIMUM_DEEPSPEED_VERSION):
        raise ElasticityError(
            f"Target deepspeed version of {target} is not compatible with minimum version "
            f"{MINIMUM_DEEPSPEED_VERSION} supporting elasticity."
        )


def compute_elastic_config(
    ds_config: dict, target_deepspeed_version: str, world_size: int = 0, return_microbatch: bool = False
) -> tuple:
    """DeepSpeed's API: ``(train_batch_size, valid_gpus)``, and the micro batch for ``world_size`` (> 0) or
    with ``return_microbatch``. ``world_size``: the data-parallel ranks (v0.2 reads WORLD_SIZE without it)."""
    if not isinstance(ds_config, dict):
        raise ValueError(
            f"Expected ds_config to be a dictionary but received a {type(ds_config)}, containing: {ds_config}"
        )
    if "elasticity" not in ds_config:
        raise ElasticityConfigError(
            "'elasticity' is missing from config json, please add it if running an elastic training job."
        )
    section = ds_config["elasticity"]
    if not section.get("enabled", False):
        raise ElasticityConfigError(
            "Elasticity is disabled, please enable it ('enabled':true) if running an elastic training job."
        )
    s = _check(section)
    version = float(s["version"])
    if s["model_parallel_size"] > 1 and version != 0.2:
        raise ElasticityConfigError(
            f"Elasticity V{s['version']} does not support model-parallel training. Given model-parallel size: "
            f"{s['model_parallel_size']}"
        )
    if version > LATEST_VERSION:
        raise ElasticityConfigError(
            f"Attempting to run elasticity version {s['version']} but runtime only supports up to {LATEST_VERSION}"
        )
    _version_ok(target_deepspeed_version)
    micro_v02 = None
    if version == 0.1:
        batch, valid = _v01(s["micro_batch_sizes"], s["max_train_batch_size"], s["min_gpus"], s["max_gpus"],
                            s["prefer_larger_batch"])  # fmt: skip
        batch = int(batch)
    elif version == 0.2:
        current = world_size
        if current == 0:
            env = os.environ.get("WORLD_SIZE")
            if env is None or not env.isnumeric():
                raise ElasticityConfigError(
                    "Elasticity V 0.2 needs WORLD_SIZE to compute valid batch size. Either give it as argument to "
                    "function compute_elastic_config or set it as an environment variable. Value of WORLD_SIZE "
                    f"as environment variable is {env}"
                )
            current = int(env)
        batch, valid, micro_v02 = _v02(s, current)
        batch = int(batch)
    else:
        raise NotImplementedError(f"Unable to find elastic logic for version: {s['version']}")
    if world_size > 0 or (return_microbatch and version != 0.2):
        if world_size > 0 and world_size not in valid:  # type: ignore[operator]
            raise ElasticityIncompatibleWorldSize(
                f"World size ({world_size}) is not valid with the current list of valid GPU counts: {valid}"
            )
        micro = next((m for m in sorted(set(s["micro_batch_sizes"]), reverse=True) if batch // world_size % m == 0),
                     None)  # fmt: skip
        if micro is None:
            raise AssertionError(
                f"Unable to find divisible micro batch size world_size={world_size}, final_batch_size={batch}, "
                f"and  micro_batches={s['micro_batch_sizes']}."
            )
        return batch, valid, micro
    if return_microbatch:
        return batch, valid, micro_v02
    return batch, valid


def elastic_batch(section: dict[str, Any], world_size: int) -> tuple[int, int, int, list[int]]:
    """``(train_batch_size, micro_batch, accumulation_steps, valid_world_sizes)`` for ``world_size``
    data-parallel ranks, as DeepSpeed's engine derives them from the section."""
    batch, valid, micro = compute_elastic_config({"elasticity": section}, "0.14.4", world_size=world_size)
    return batch, micro, batch // (micro * world_size), list(valid)
