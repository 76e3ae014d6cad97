"""Checkpoint state: the ds-flat-shard/1 format, and bit-identical continuation after a restore."""

import json
import math

import pytest
import torch
from _dsp_helpers import assert_same_state, batches, make_model, make_wrapped, master_state, train
from ds_precision import DynamicLossScaler, MixedPrecisionOptimizer


def _overflow_at(steps):
    def inject(step, model):
        if step in steps:
            model.fc1.weight.grad.view(-1)[0] = math.inf

    return inject


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_save_and_restore_mid_run_continues_bit_identically(dtype):
    data = batches(12)
    make = (
        dict(scaler=DynamicLossScaler(initial_scale_power=10, loss_scale_window=2))
        if dtype == torch.float16
        else {}
    )
    model, opt = make_wrapped(dtype, **make)
    train(model, opt, data[:6], dtype, inject=_overflow_at({2}))
    tensors, meta = opt.sharded_state_dict()
    meta = json.loads(json.dumps(meta))  # plain JSON, no pickled classes
    model_state = {k: v.clone() for k, v in model.state_dict().items()}
    train(model, opt, data[6:], dtype, inject=_overflow_at({3}))

    make = (
        dict(scaler=DynamicLossScaler(initial_scale_power=10, loss_scale_window=2))
        if dtype == torch.float16
        else {}
    )
    resumed, ropt = make_wrapped(
        dtype, seed=123, **make
    )  # different init: everything must come from the save
    resumed.load_state_dict(model_state)
    ropt.load_sharded_state_dict(tensors, meta)
    assert (ropt.global_steps, ropt.skipped_steps) == (6, 1)
    train(resumed, ropt, data[6:], dtype, inject=_overflow_at({3}))

    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    assert_same_state(master_state(opt), master_state(ropt))
    assert ropt.loss_scale == opt.loss_scale and ropt.skipped_steps == opt.skipped_steps == 2


def test_format_matches_the_architecture():
    model, opt = make_wrapped(torch.float16)
    train(model, opt, batches(2), torch.float16)
    tensors, meta = opt.sharded_state_dict()
    n = sum(p.numel() for p in model.parameters())
    assert meta["format"] == "ds-flat-shard/1"
    (group,) = meta["groups"]
    assert group["numel"] == n and group["shard"] == [0, n]
    assert [p["name"] for p in group["params"]] == [name for name, _ in model.named_parameters()]
    offsets = [p["offset"] for p in group["params"]]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert group["hparams"]["lr"] == 1e-2 and group["hparams"]["betas"] == [0.9, 0.999]
    assert group["scalars"] == {"step": 2.0}
    assert meta["extra"]["loss_scaler"]["cur_scale"] == opt.loss_scale
    assert set(tensors) == {"g0.master", "g0.exp_avg", "g0.exp_avg_sq"}
    assert all(t.dtype == torch.float32 and t.shape == (n,) for t in tensors.values())
    # the master slice of a parameter is that parameter in fp32
    p = group["params"][2]
    w = dict(model.named_parameters())[p["name"]]
    assert torch.equal(
        tensors["g0.master"][p["offset"] : p["offset"] + w.numel()].half(), w.detach().flatten()
    )


def test_params_without_state_and_with_their_own_step_survive_a_round_trip():
    model = make_model(dtype=torch.bfloat16)
    extra = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    opt = MixedPrecisionOptimizer(
        torch.optim.Adam([*model.parameters(), extra], lr=0.1), dtype=torch.bfloat16
    )
    train(model, opt, batches(2), torch.bfloat16)
    extra.grad = torch.ones(3, dtype=torch.bfloat16)  # one more step for `extra` only
    model.zero_grad()
    opt.step()
    tensors, meta = opt.sharded_state_dict()
    entries = meta["groups"][0]["params"]
    assert meta["groups"][0]["scalars"] == {"step": 2.0} and entries[-1]["scalars"] == {"step": 1.0}

    model2 = make_model(dtype=torch.bfloat16)
    extra2 = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    opt2 = MixedPrecisionOptimizer(
        torch.optim.Adam([*model2.parameters(), extra2], lr=0.1), dtype=torch.bfloat16
    )
    opt2.load_sharded_state_dict(tensors, json.loads(json.dumps(meta)))
    assert_same_state(master_state(opt), master_state(opt2))
    assert torch.equal(extra2, extra)

    fresh = MixedPrecisionOptimizer(
        torch.optim.Adam(make_model(dtype=torch.bfloat16).parameters(), lr=0.1), dtype=torch.bfloat16
    )
    tensors, meta = fresh.sharded_state_dict()
    assert all(p.get("has_state") is False for p in meta["groups"][0]["params"])
    fresh.load_sharded_state_dict(tensors, meta)
    assert len(fresh.state) == 0


def test_restored_hparams_keep_their_python_types():
    model, opt = make_wrapped(torch.bfloat16)
    train(model, opt, batches(1), torch.bfloat16)
    opt.param_groups[0]["lr"] = 0.5
    state = opt.state_dict()
    model2, opt2 = make_wrapped(torch.bfloat16)
    opt2.load_state_dict({"tensors": state["tensors"], "meta": json.loads(json.dumps(state["meta"]))})
    assert opt2.param_groups[0]["lr"] == 0.5 and opt2.param_groups[0]["betas"] == (0.9, 0.999)


def test_loading_into_a_different_model_names_the_mismatch():
    model, opt = make_wrapped(torch.bfloat16)
    tensors, meta = opt.sharded_state_dict()
    meta["groups"][0]["params"][0]["shape"] = [99, 6]
    with pytest.raises(ValueError, match="fc1.weight"):
        opt.load_sharded_state_dict(tensors, meta)
    meta["groups"][0]["shard"] = [0, 5]
    with pytest.raises(ValueError, match="read the whole flat space"):
        opt.load_sharded_state_dict(tensors, meta)
