"""Faults at 2 real gloo ranks: each is an error naming the stage (and the layer), on every rank, not a hang."""

from __future__ import annotations

import pytest
from _workers import faults
from rank_testing import spawn


def test_more_stages_than_layers_names_the_stage():
    for msg in spawn(faults, 2, "more_stages_than_layers", timeout_s=60):
        assert msg.startswith("PipelineError: 2 pipeline stages but only 1 layers: stage 1")


def test_shape_change_between_micro_batches_names_stage_and_layer():
    first, last = spawn(faults, 2, "shape_change", timeout_s=60)
    assert "stage 0: the output of layer 1 (Block) changed between micro-batches" in first
    assert "(2, 4)" in first and "(3, 4)" in first
    assert last.startswith("PipelineError: stage 1: stage 0 (rank 0) failed or died")


def test_data_iterator_ending_early_names_the_stage():
    first, last = spawn(faults, 2, "iterator_ends_early", timeout_s=60)
    assert "stage 0: the data iterator ended after 3 of 4 micro-batches" in first
    # the last stage reads the same iterator one instruction later: it either finds it ended, or finds stage 0 gone
    assert (
        "stage 1: the data iterator ended after 3" in last
        or "stage 1: stage 0 (rank 0) failed or died" in last
    )


def test_a_dead_stage_is_an_error_naming_it_on_its_neighbour():
    with pytest.raises(RuntimeError) as info:  # rank 1 never reports: spawn names it, with rank 0's error
        spawn(faults, 2, "stage_dies", timeout_s=60)
    assert "PipelineError: stage 0: stage 1 (rank 1) failed or died during" in str(info.value)


def test_a_hung_stage_is_an_error_naming_it_after_the_timeout():
    """A stage alive but stuck sends nothing and says nothing: its neighbour gives up after the timeout and
    names it (a dead one is named at once, above)."""
    with pytest.raises(RuntimeError) as info:  # rank 1 sleeps on: spawn names rank 0's error and ends it
        spawn(faults, 2, "stage_hangs", timeout_s=60)
    message = str(info.value)
    assert "PipelineError: stage 0: stage 1 (rank 1) did not answer for 2 s during RecvGrad" in message
    assert "it hangs" in message
