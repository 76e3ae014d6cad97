"""The MoE layer: expert parallelism at 2 and 4 ranks against one rank holding every expert (real gloo ranks);
routing facts on one process."""

from __future__ import annotations

import _moe_layer_workers as w
import pytest
import torch
from ds_moe import (
    MoE,
    configure_moe_param_groups,
    is_moe_param,
    split_params_into_different_moe_groups_for_optimizer,
    top1_routes,
    top2_routes,
)
from rank_testing import spawn

TOL = 1e-5


@pytest.mark.parametrize(
    ("world", "ep", "k", "drop"), [(2, 2, 1, True), (2, 2, 2, False), (4, 2, 2, True), (4, 4, 1, False)]
)
def test_expert_parallel_matches_one_rank_with_every_expert(world, ep, k, drop):
    for r in spawn(w.ep_matches_one_rank, world, ep, k, drop, timeout_s=240):
        assert r["counts"]
        for key in ("out", "l_aux", "x_grad", "expert_grad", "gate_grad"):
            assert r[key] < TOL, (key, r)
        assert r["all_to_all_calls"] == 4  # dispatch and combine, forward and backward


def test_top1_keeps_capacity_tokens_per_expert():
    logits = torch.tensor([[2.0, 0.0]] * 5 + [[0.0, 2.0]])
    for rts in (False, True):
        r = top1_routes(logits, capacity_factor=1.0, min_capacity=0, use_rts=rts)
        assert r.capacity == 3  # ceil(6 tokens / 2 experts * 1.0)
        experts, slots = r.experts[0].tolist(), r.slots[0].tolist()
        assert experts.count(0) == 3 and experts.count(-1) == 2 and experts[5] == 1
        assert sorted(s for e, s in zip(experts, slots) if e == 0) == [0, 1, 2]
        assert r.exp_counts.tolist() == [5, 1]  # counted before dropping


def test_top2_second_choice_queues_behind_first_and_weights_normalise():
    logits = torch.tensor([[3.0, 1.0, 0.0], [3.0, 0.0, 1.0]])
    r = top2_routes(logits, capacity_factor=4.0, min_capacity=0, second_sampling=False)
    assert r.experts.tolist() == [[0, 0], [1, 2]]
    assert r.slots.tolist() == [[0, 1], [0, 0]]
    assert torch.allclose(r.weights.sum(0), torch.ones(2))


def test_l_aux_is_deepspeeds_formula():
    torch.manual_seed(0)
    logits = torch.randn(10, 4)
    probs = logits.softmax(1)
    ce = torch.nn.functional.one_hot(probs.argmax(1), 4).float().mean(0)
    r1 = top1_routes(logits, 1.0, 0, use_rts=False)
    assert torch.allclose(r1.l_aux, (probs.mean(0) * ce).sum() * 4)
    r2 = top2_routes(logits, 1.0, 0, second_sampling=False)
    assert torch.allclose(r2.l_aux, (probs.mean(0) * ce).mean() * 16)


def test_expert_params_are_marked_and_split_into_their_own_groups():
    moe = MoE(4, torch.nn.Linear(4, 4), num_experts=2)
    expert = [p for p in moe.parameters() if is_moe_param(p)]
    assert len(expert) == 4 and all(p.group_name == "ep_size_1" for p in expert)
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(moe.parameters()), "name": "g", "lr": 0.1}
    )
    assert [len(g["params"]) for g in groups] == [1, 4]
    assert groups[1]["moe"] and groups[1]["name"] == "ep_size_1" and groups[1]["lr"] == 0.1


def test_config_optimizer_groups_are_deepspeeds():
    """A config optimizer's parameters become DeepSpeed's groups: 'dense-params' and one per expert group;
    groups already marked 'moe' are kept; unmarked groups are split."""
    moe = MoE(4, torch.nn.Linear(4, 4), num_experts=2)
    groups = configure_moe_param_groups(list(moe.parameters()))
    assert [(g["name"], len(g["params"]), g.get("moe", False)) for g in groups] == [
        ("dense-params", 1, False),
        ("ep_size_1", 4, True),
    ]
    assert configure_moe_param_groups(groups) is groups
    split = configure_moe_param_groups([{"params": list(moe.parameters()), "name": "all"}])
    assert [len(g["params"]) for g in split] == [1, 4]
    with pytest.raises(TypeError, match="Tensors or dicts"):
        configure_moe_param_groups([1])


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="multiple of ep_size"):
        MoE(4, torch.nn.Linear(4, 4), num_experts=3, ep_size=2)
    with pytest.raises(ValueError, match="top 1 or top 2"):
        MoE(4, torch.nn.Linear(4, 4), num_experts=2, k=3)
    moe = MoE(4, torch.nn.Linear(4, 4), num_experts=2, ep_size=2, min_capacity=0)
    with pytest.raises(RuntimeError, match="no expert-parallel group"):
        moe(torch.randn(2, 4))
