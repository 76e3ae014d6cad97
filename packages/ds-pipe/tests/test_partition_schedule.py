"""Partition boundaries and schedules equal DeepSpeed 0.19.8's (recorded by
tools/fixtures/make_deepspeed_pipe_fixtures.py); topologies lay ranks out as DeepSpeed's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ds_pipe import (
    InferenceSchedule,
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
    ProcessTopology,
    TrainSchedule,
    partition_balanced,
    partition_uniform,
)

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "deepspeed_pipe.json").read_text())


@pytest.mark.parametrize("n,p,parts", FIXTURE["uniform"])
def test_uniform_equals_deepspeed(n, p, parts):
    assert partition_uniform(n, p) == parts


@pytest.mark.parametrize("weights,p,parts", FIXTURE["balanced"])
def test_balanced_equals_deepspeed(weights, p, parts):
    assert partition_balanced(weights, p) == parts


@pytest.mark.parametrize("kind,m,p,s,buffers,steps", FIXTURE["schedules"])
def test_schedules_equal_deepspeed(kind, m, p, s, buffers, steps):
    sched = (TrainSchedule if kind == "train" else InferenceSchedule)(micro_batches=m, stages=p, stage_id=s)
    got = [[[c.name, c.kwargs.get("buffer_id")] for c in step] for step in sched.steps()]
    assert got == steps
    assert sched.num_pipe_buffers() == buffers


def test_train_schedule_keeps_at_most_stages_in_flight():
    # 1F1B: a stage never holds more forwards without their backward than stages - stage_id
    for p in (2, 4):
        for s in range(p):
            live, peak = 0, 0
            for step in TrainSchedule(micro_batches=8, stages=p, stage_id=s).steps():
                for c in step:
                    live += {"ForwardPass": 1, "BackwardPass": -1}.get(c.name, 0)
                    peak = max(peak, live)
            assert peak == p - s


def test_topologies_lay_ranks_out_as_deepspeed():
    t = PipeDataParallelTopology(num_pp=2, num_dp=2)
    assert t.get_axis_comm_lists("pipe") == [[0, 2], [1, 3]]
    assert t.get_axis_comm_lists("data") == [[0, 1], [2, 3]]
    assert t.get_coord(3).pipe == 1 and t.get_coord(3).data == 1
    m = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert m.get_axis_comm_lists("pipe")[:2] == [[0, 4], [1, 5]]
    assert m.filter_match(pipe=0, data=1) == [2, 3]
    assert m.get_rank_repr(rank=3) == "model_01"
    assert m.get_rank(pipe=1, data=0, model=1) == 5
    x = ProcessTopology(axes=["x", "y"], dims=[2, 3])
    assert x.get_axis_list("y", 0) == [0, 3] and x.get_dim("z") == 0 and x.world_size() == 6
