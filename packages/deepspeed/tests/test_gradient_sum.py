"""``gradient_allreduce_op: "sum"`` at ZeRO stages 0-2 (DeepSpeed 0.19.8 takes it there; its refusals at stage 3,
ZenFlow and DeepCompile are in test_compat_behaviour.py): the step uses the summed gradient, at 2 real ranks."""

from __future__ import annotations

import _sum_workers as w
import pytest
import torch
from rank_testing import spawn


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return spawn(w.step_deltas, 2, timeout_s=300)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_sum_steps_with_world_size_times_the_mean(runs, stage):
    for r in runs:
        mean, summed = r[f"{stage}.mean"], r[f"{stage}.sum"]
        assert mean.abs().sum() > 0
        torch.testing.assert_close(summed, 2 * mean)  # two ranks: the sum is twice the average
    torch.testing.assert_close(runs[0][f"{stage}.sum"], runs[1][f"{stage}.sum"])
