"""initialize()'s tensor-parallel checks, before any group is made: the degree must divide the world, and
AutoTP does not combine with an mpu's (or a pipeline's) groups."""

from __future__ import annotations

import pytest
from ds_engine._args import InitializeError
from ds_engine._initialize import _parallel_topology


def test_a_degree_that_does_not_divide_the_world_names_both_numbers():
    with pytest.raises(InitializeError, match=r"autotp_size 3 does not divide the world size 4.*\[1, 2, 4\]"):
        _parallel_topology({"tensor_parallel": {"autotp_size": 3}}, None, 4)


def test_autotp_with_an_mpu_is_refused():
    with pytest.raises(InitializeError, match="autotp_size 2 with an mpu"):
        _parallel_topology({"tensor_parallel": {"autotp_size": 2}}, object(), 4)


@pytest.mark.parametrize("section", [None, {}, {"autotp_size": 0}, {"autotp_size": 1}, {"autotp_size": "2"}])
def test_no_tensor_parallelism_builds_nothing(section):
    raw = {"train_batch_size": 2} if section is None else {"tensor_parallel": section}
    assert _parallel_topology(raw, None, 4) is None
