"""``sequence_parallel_size``: DeepSpeed's top-level Ulysses degree (the engine reads it; ds-engine's tests train it)."""

import pytest
from ds_config import ConfigError, load_config


def test_default_is_one_and_a_degree_is_read():
    assert load_config({"train_batch_size": 2}, world_size=1).sequence_parallel_size == 1
    assert (
        load_config({"train_batch_size": 2, "sequence_parallel_size": 4}, world_size=1).sequence_parallel_size
        == 4
    )


@pytest.mark.parametrize("bad", [0, -2, "two", 1.5])
def test_a_degree_below_one_or_not_an_integer_is_an_error(bad):
    with pytest.raises(ConfigError, match="sequence_parallel_size"):
        load_config({"train_batch_size": 2, "sequence_parallel_size": bad}, world_size=1)
