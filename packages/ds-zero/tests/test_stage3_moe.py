"""ZeRO-3 with mixture-of-experts blocks whose ranks run different experts (skewed routing), on real ranks.

A block holding its experts in a list named ``experts`` is a leaf on its own; ``set_leaf_modules`` makes
any other block one. A leaf's parameters are gathered once for its forward and once for its backward,
so ranks routing differently still issue the same collectives, and training matches plain torch.
"""

from __future__ import annotations

import _moe_workers as w
import pytest
from rank_testing import spawn

TOL = 2e-6
STEPS = 3
# fetches a step: inp, block1, block2, out in forward; the same in backward (inp's gradient ends it)
LEAF_FETCHES = (4, 4)


def _parity(results, world):
    ref = w.train_reference(world, STEPS)
    for r in results:
        err = max((r["state"][k] - v).abs().max().item() for k, v in ref.items())
        assert err < TOL, f"weights differ from plain torch by {err}"


@pytest.mark.parametrize("world", [2, 4])
def test_skewed_routing_expert_list_is_a_leaf_and_trains_like_torch(world):
    results = spawn(w.train_zero3, world, STEPS, "auto", timeout_s=240)
    _parity(results, world)
    for r in results:
        assert r["fetches"] == [LEAF_FETCHES] * STEPS


def test_set_leaf_modules_gathers_a_block_once_a_forward_and_once_a_backward():
    results = spawn(w.train_zero3, 2, STEPS, "class", timeout_s=240)
    _parity(results, 2)
    for r in results:
        assert r["fetches"] == [LEAF_FETCHES] * STEPS
        assert "block1.gate.weight" in r["leaf_params"] and "inp.weight" not in r["leaf_params"]


def test_unset_leaf_modules_gathers_per_module():
    (r,) = spawn(w.train_zero3, 1, 1, "off", timeout_s=240)
    fwd, bwd = r["fetches"][0]
    assert fwd > LEAF_FETCHES[0] and bwd > LEAF_FETCHES[1]
    assert r["leaf_params"] == []
