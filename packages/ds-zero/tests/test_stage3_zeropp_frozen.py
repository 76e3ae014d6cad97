"""Frozen parameters partitioned at stage 3, on 2 gloo ranks: a LoRA-style model (frozen base, trainable
adapters) built from a config with ``zero_quantized_nontrainable_weights`` off (partitions in the
parameters' dtype, as DeepSpeed partitions them) and on (int8 partitions), against ds's earlier behaviour
of keeping frozen parameters whole on every rank (``whole``; ``_frozen_workers``).

The effect is observed on the real tensors: the storages of the frozen parameters at rest (half of the
elements per rank: in their dtype without the key; int8 with it, about one byte per owned element against
fp32's four and bf16's two), every live tensor storage, the collectives on the wire (the partitions are what
is all-gathered), the weight the forward computes with (exact without the key, the dequantized value with
it, the same on every rank) and the losses: without the key equal to the whole run's to the last bit, with
it within DeepSpeed's ZeRO++ tolerance (its convergence test: the quantized run's loss below 1.1x the
baseline's). DeepSpeed 0.19.8 cannot run
this path on CPU (its quantizer op has no CPU implementation), so there is no DeepSpeed fixture.
"""

from __future__ import annotations

import _frozen_workers as w
import pytest
import torch
from rank_testing import spawn


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return spawn(w.main, 2, timeout_s=600, env={"DS_ZERO_COLLECTIVES": "torch"})


def _frozen_gathers(run: dict, phase: str) -> list[dict]:
    return [c for c in run["calls"] if c["phase"] == phase and c["op"] == "all_gather"]


@pytest.mark.parametrize("case", ["on", "bf16_on"])
def test_frozen_partitions_are_int8_at_a_quarter_of_fp32_and_half_of_bf16(runs, case):
    for r in runs:
        q = r[case]
        assert q["stored_dtypes"] == {"torch.int8"}
        # each rank keeps its half of the frozen elements (padding included), about one byte each
        assert q["frozen_numel"] / 2 <= q["stored_numel"] < q["frozen_numel"] / 2 + 100
        per_element = q["stored_bytes"] / q["stored_numel"]
        assert 1.0 <= per_element < 1.01, per_element  # int8 + one fp32 scale per block of 2048
        assert per_element / q["element_size"] < (0.26 if case == "on" else 0.51)  # fp32's 4 bytes, bf16's 2
        # against the same parameters whole before wrapping (as ds keeps them without the key)
        assert q["whole_bytes"] == q["frozen_numel"] * q["element_size"]
        assert q["stored_bytes"] < q["whole_bytes"] / (2 * q["element_size"]) * 1.01


@pytest.mark.parametrize("case", ["off", "bf16_off"])
def test_without_the_key_each_rank_stores_half_of_every_frozen_parameter_in_its_dtype(runs, case):
    for r in runs:
        q = r[case]
        assert q["stored_dtypes"] == {"torch.float32" if case == "off" else "torch.bfloat16"}
        assert q["frozen_numel"] / 2 <= q["stored_numel"] < q["frozen_numel"] / 2 + 100
        assert q["stored_bytes"] == q["stored_numel"] * q["element_size"]  # the dtype's bytes, nothing more
        assert q["whole_bytes"] == q["frozen_numel"] * q["element_size"]
        assert q["whole_bytes"] / 2 <= q["stored_bytes"] < q["whole_bytes"] / 2 * 1.01


@pytest.mark.parametrize("case", ["off", "on"])
def test_live_storage_shrinks_by_what_the_frozen_storages_save(runs, case):
    for r in runs:
        q, whole = r[case], r["whole"]
        assert whole["stored_dtypes"] == {"torch.float32"} and whole["stored_bytes"] == q["whole_bytes"]
        # every live tensor storage: no full copy of a frozen parameter is left anywhere
        saved = whole["live_bytes"] - q["live_bytes"]
        assert saved > (0.8 if case == "on" else 0.45) * whole["stored_bytes"]
        assert abs(saved - (whole["stored_bytes"] - q["stored_bytes"])) <= 0.01 * whole["stored_bytes"]


def test_frozen_partitions_are_what_is_all_gathered(runs):
    for r in runs:
        whole = r["whole"]
        assert not _frozen_gathers(whole, "forward")  # whole frozen parameters are never gathered
        for case in ("off", "on"):
            q = r[case]
            gathers = _frozen_gathers(q, "forward")
            assert {c["dtype"] for c in gathers} == {"torch.uint8"}  # the payloads' bytes
            # each forward sends this rank's stored payloads once: fp32 values, or int8 values and scales
            assert sum(c["bytes"] for c in gathers) == w.STEPS * q["stored_bytes"]

        # trainable parameters are untouched: the same collectives, dtype and bytes as with whole frozen ones
        def trainable(run: dict) -> list[tuple]:
            return [(c["op"], c["dtype"], c["bytes"]) for c in run["calls"] if c["op"] != "all_gather"]

        assert trainable(r["on"]) == trainable(r["off"]) == trainable(whole)
        assert r["on"]["trainable_part_dtypes"] == r["off"]["trainable_part_dtypes"] == ["torch.float32"]


def test_forward_computes_with_the_dequantized_weights_on_every_rank(runs):
    for r in runs:
        q, plain = r["on"], r["off"]
        assert plain["forward_weight_error"] == r["whole"]["forward_weight_error"] == 0.0
        assert torch.equal(plain["state_weight"], r["whole"]["state_weight"])  # whole and exact
        # GatheredParameters: the whole stored value; rank 0's modification is kept, exactly without the key
        assert torch.equal(plain["gathered_weight"], plain["state_weight"])
        assert torch.equal(plain["modified_weight"], 2 * plain["state_weight"])
        assert torch.equal(q["gathered_weight"], q["state_weight"])
        step = 2 * q["forward_weight_scale"] / 127  # the doubled weight is quantized again
        assert (q["modified_weight"] - 2 * q["state_weight"]).abs().max() <= step
        # within half a quantization step of the block's largest magnitude, and not exact
        assert 0 < q["forward_weight_error"] <= q["forward_weight_scale"] / 127 / 2 * 1.001
        assert not q["forward_weight_changed"]  # frozen: the same value every step
        assert torch.equal(q["state_weight"], q["forward_weight"])  # module_state_dict: the stored value
        # a strict load without the frozen weights names them missing, as when they are whole
        assert (
            q["strict_load_missing"] == plain["strict_load_missing"] == r["whole"]["strict_load_missing"]
            and len(plain["strict_load_missing"]) == 7
        )
    assert torch.equal(runs[0]["on"]["forward_weight"], runs[1]["on"]["forward_weight"])


def test_frozen_parameters_are_released_once_their_modules_backward_is_done(runs):
    for r in runs:
        # when the gradient reaches l1's output, l2's and the head's backward are over: their frozen weights
        # (gathered again for the input gradients) are released, none is left whole
        for case in ("off", "on"):
            assert r[case]["whole_in_backward"] == []
            assert r[case]["frozen_released"]
        assert len(r["whole"]["whole_in_backward"]) == 7  # kept whole, they are whole all along


def test_partitioned_frozen_losses_equal_whole_frozen_losses_exactly(runs):
    for r in runs:
        assert r["off"]["losses"] == r["whole"]["losses"] == runs[0]["whole"]["losses"]


def test_losses_within_deepspeeds_tolerance(runs):
    plain, quant = runs[0]["off"]["losses"], runs[0]["on"]["losses"]
    assert runs[1]["on"]["losses"] == quant
    assert quant != plain, "quantization changes the frozen values"
    assert sum(plain[1:]) / (len(plain) - 1) < 0.95 * plain[0], "the adapters learn"
    assert sum(quant[-3:]) / 3 < 1.1 * sum(plain[-3:]) / 3  # DeepSpeed's bound
    assert max(abs(q - p) / p for q, p in zip(quant, plain)) < 0.01


def test_frozen_weights_cut_by_zero_init_stay_partitioned_and_compute_as_built_whole(runs):
    # without the key they stay partitioned in their dtype; with it they become int8 partitions
    assert all(r["built_in_init"] == {False: (True, True), True: (True, True)} for r in runs)
