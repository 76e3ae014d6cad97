"""Each option observed by its effect (calls, bytes, dtypes, in-flight reductions), at 2 real ranks."""

from __future__ import annotations

import _effects as e
import pytest
import torch
from rank_testing import spawn


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return spawn(e.main, 2, timeout_s=600)


def test_allgather_partitions_false_broadcasts_from_each_owner(runs):
    for r in runs:
        native, shipped = r["gather"]["native"], r["gather"]["shipped"]
        # where the backend's all-gather is its native collective, the flag switches to broadcasts
        assert native[True].get("c10d.allgather_", 0) >= 1 and "c10d.broadcast_" not in native[True]
        assert native[False].get("c10d.broadcast_", 0) == 2 and "c10d.allgather_" not in native[False]
        # on gloo the fastest all-gather *is* a broadcast per owner (measured), so both settings broadcast
        for flag in (True, False):
            assert shipped[flag].get("c10d.broadcast_", 0) == 2 and "c10d.allgather_" not in shipped[flag]


def test_stage2_overlap_comm_leaves_reductions_in_flight_during_backward(runs):
    for r in runs:
        on, off = r["overlap"][True], r["overlap"][False]
        assert on["buckets"] >= 3
        launched, inflight = on["launched_inflight"]
        assert launched >= 2 and inflight >= 2  # launched and not waited for while backward runs
        launched, inflight = off["launched_inflight"]
        assert launched >= 2 and inflight == 0  # each reduction completes before backward goes on
        for k, v in on["w"].items():
            assert torch.equal(v, off["w"][k]), k


def test_prescale_and_predivide_scale_before_the_sum(runs):
    for r in runs:
        s = r["scaling"]
        assert s["prescale"] == pytest.approx(s["plain"] / 2, rel=1e-6)  # 1/dp
        assert s["predivide"] == pytest.approx(s["plain"] / 4, rel=1e-6)  # 1/predivide


def test_stage0_all_reduces_large_gradients_where_they_are(runs):
    """A gradient of at least IN_PLACE_MIN_ELEMS elements is its own all_reduce, on ``.grad`` itself; the
    small ones travel together in one flat buffer. Either way every rank ends with the average."""
    for r in runs:
        s = r["in_place"]
        assert s["big_numel"] >= 1 << 18 and s["same_tensor"]
        assert (s["big_storage"], s["big_numel"]) in s["all_reduced"]
        assert len(s["all_reduced"]) == 2  # the large gradient, and one buffer of all the others
        assert sum(n for _, n in s["all_reduced"]) == s["numel"]
    for name, avg in runs[0]["in_place"]["averaged"].items():
        want = (runs[0]["in_place"]["local"][name] + runs[1]["in_place"]["local"][name]) / 2
        torch.testing.assert_close(avg, want)
        assert torch.equal(avg, runs[1]["in_place"]["averaged"][name])


def test_fp32_allreduce_carries_fp32(runs):
    for r in runs:
        assert r["fp32_allreduce"][True] == ["torch.float32"]
        assert r["fp32_allreduce"][False] == ["torch.bfloat16"]


def test_sparse_gradients_send_rows_not_the_table(runs):
    for r in runs:
        sparse, dense = r["sparse"][True], r["sparse"][False]
        assert sparse["bytes"] * 20 < dense["bytes"], (sparse["bytes"], dense["bytes"])
        assert torch.allclose(sparse["grad"], dense["grad"], atol=1e-7)


def test_ignore_unused_parameters_false_names_each_unused_parameter(runs):
    """As DeepSpeed 0.19.8 (stage_1_and_2.py, complete_grad_norm_calculation_for_cpu_offload): checked only
    with optimizer offload, as an AssertionError (ds's ZeroAssertionError is both)."""
    for r in runs:
        for stage in (1, 2):
            assert r["unused"][(stage, True, True)] is None
            assert r["unused"][(stage, True, False)] is None
            assert r["unused"][(stage, False, False)] is None  # no offload: DeepSpeed does not check
            message, is_assertion = r["unused"][(stage, False, True)]
            assert is_assertion
            assert "unused.weight" in message and "unused.bias" in message, message
            assert "0.weight" not in message and "ignore_unused_parameters" in message
