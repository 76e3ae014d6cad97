"""The ``elasticity`` section derives the batch sizes from the world size (DeepSpeed's engine behaviour)."""

from __future__ import annotations

import pytest
from ds_config import ConfigError, load_config

SECTION = {"enabled": True, "max_train_batch_size": 100, "micro_batch_sizes": [2, 4, 6], "min_gpus": 1,
           "max_gpus": 8, "version": 0.1}  # fmt: skip


@pytest.mark.parametrize(("world", "micro", "gas"), [(1, 6, 16), (2, 6, 8), (3, 4, 8), (4, 6, 4), (8, 6, 2)])
def test_the_global_batch_stays_and_the_split_follows_the_world(world, micro, gas):
    cfg = load_config({"elasticity": SECTION}, world_size=world)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (
        96,
        micro,
        gas,
    )


def test_batch_keys_beside_it_are_refused_unless_ignored():
    with pytest.raises(ConfigError, match="ignore_non_elastic_batch_info"):
        load_config({"elasticity": SECTION, "train_batch_size": 32}, world_size=2)
    cfg = load_config({"elasticity": {**SECTION, "ignore_non_elastic_batch_info": True}, "train_batch_size": 32},
                      world_size=2)  # fmt: skip
    assert cfg.train_batch_size == 96


def test_a_world_the_batch_cannot_split_over_is_refused():
    with pytest.raises(ConfigError, match=r"ElasticityIncompatibleWorldSize: World size \(5\) is not valid"):
        load_config({"elasticity": SECTION}, world_size=5)


def test_disabled_section_changes_nothing():
    cfg = load_config({"elasticity": {**SECTION, "enabled": False}, "train_batch_size": 8}, world_size=2)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu) == (8, 4)
