"""LR schedules against the spec's verified values and against their formulas at many iterations."""

from __future__ import annotations

import math
import types

import pytest
import torch
from ds_config import SchedulerConfig
from ds_optim import (
    LRRangeTest,
    OneCycle,
    OptimizerConfigError,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
    build_scheduler,
    scheduler_from_config,
)


def _opt(lr: float = 1e-3, groups: int = 1) -> torch.optim.Optimizer:
    params = [{"params": [torch.nn.Parameter(torch.zeros(2))]} for _ in range(groups)]
    return torch.optim.Adam(params, lr=lr)


def _lrs_after_steps(sched, n: int) -> list[float]:
    out = []
    for _ in range(n):
        sched.step()
        out.append(sched.optimizer.param_groups[0]["lr"])
    return out


def test_warmup_lr_log_matches_spec_values():
    sched = WarmupLR(_opt(), warmup_min_lr=0, warmup_max_lr=1e-3, warmup_num_steps=10)
    expected = [0, 3.010e-4, 4.771e-4, 6.021e-4, 6.990e-4, 7.782e-4, 8.451e-4, 9.031e-4, 9.542e-4, 1e-3, 1e-3]
    assert _lrs_after_steps(sched, 11) == pytest.approx(expected, abs=1e-7)


def test_warmup_lr_linear_matches_spec_values():
    sched = WarmupLR(_opt(), warmup_min_lr=0, warmup_max_lr=1e-3, warmup_num_steps=10, warmup_type="linear")
    assert _lrs_after_steps(sched, 11) == pytest.approx([i * 1e-4 for i in range(10)] + [1e-3])


def test_warmup_lr_writes_min_lr_at_construction_and_get_lr_is_not_zero():
    opt = _opt(lr=0.5)
    sched = WarmupLR(opt, warmup_min_lr=0.01, warmup_max_lr=0.1, warmup_num_steps=5)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    assert sched.get_lr() == pytest.approx([0.01])


@pytest.mark.parametrize("warmup_type", ["log", "linear"])
def test_warmup_lr_formula_many_iterations(warmup_type):
    lo, hi, n = 1e-5, 3e-3, 37
    sched = WarmupLR(_opt(), lo, hi, n, warmup_type)
    for it, lr in enumerate(_lrs_after_steps(sched, 200)):
        gamma = (math.log(it + 1) / math.log(n) if warmup_type == "log" else it / n) if it < n else 1.0
        assert lr == pytest.approx(lo + (hi - lo) * gamma, rel=1e-12)


def test_warmup_lr_rejects_non_positive_steps_and_warns_on_unknown_type():
    with pytest.raises(ValueError, match="warmup_num_steps"):
        WarmupLR(_opt(), warmup_num_steps=0)
    with pytest.warns(UserWarning, match="warmup_type"):
        sched = WarmupLR(_opt(), warmup_num_steps=10, warmup_type="cosine")
    assert sched.warmup_type == "log"


def test_warmup_decay_lr_matches_spec_values():
    sched = WarmupDecayLR(_opt(), total_num_steps=20, warmup_num_steps=10, warmup_type="linear")
    lrs = _lrs_after_steps(sched, 22)
    assert lrs[9] == pytest.approx(9e-4)
    assert lrs[10] == pytest.approx(1e-3)
    assert lrs[11:21] == pytest.approx([(20 - it) / 10 * 1e-3 for it in range(11, 21)])
    assert lrs[20] == 0 and lrs[21] == 0


def test_warmup_cosine_lr_matches_spec_values_and_stays_at_minimum_past_total():
    sched = WarmupCosineLR(_opt(1e-3), total_num_steps=20, warmup_num_steps=10, warmup_type="linear")
    lrs = _lrs_after_steps(sched, 40)
    assert lrs[9] == pytest.approx(9e-4)
    assert lrs[10] == pytest.approx(9.755e-4, rel=1e-4)
    assert lrs[19] == pytest.approx(1e-7)
    # DeepSpeed 0.14 rises again to 2.457e-5 at it=20; the cosine is clamped here.
    assert lrs[20:] == pytest.approx([1e-7] * 20)


def test_warmup_cosine_formula_many_iterations_and_no_zero_division():
    org, n, total, wmin, cmin = 2e-3, 13, 100, 0.05, 0.01
    sched = WarmupCosineLR(_opt(org), total, wmin, n, cmin, "log")
    for it, lr in enumerate(_lrs_after_steps(sched, 150)):
        if it < n:
            ratio = wmin + (1 - wmin) * math.log(it + 1) / math.log(n)
        else:
            progress = min(1.0, (it - n + 1) / (total - n))
            ratio = cmin + (1 - cmin) * (1 + math.cos(math.pi * progress)) / 2
        assert lr == pytest.approx(org * ratio, rel=1e-12)
    flat = WarmupCosineLR(_opt(), total_num_steps=10, warmup_num_steps=10)
    assert _lrs_after_steps(flat, 12)[-1] == pytest.approx(1e-3 * 1e-4)


def test_warmup_cosine_state_keeps_original_lr_across_resume():
    opt = _opt(1e-3)
    sched = WarmupCosineLR(opt, total_num_steps=50, warmup_num_steps=5)
    _lrs_after_steps(sched, 20)
    state = sched.state_dict()
    resumed_opt = _opt(opt.param_groups[0]["lr"])  # an optimizer restored with the scheduled lr
    resumed = WarmupCosineLR(resumed_opt, total_num_steps=50, warmup_num_steps=5)
    resumed.load_state_dict(state)
    assert _lrs_after_steps(resumed, 5) == pytest.approx(_lrs_after_steps(sched, 5))


def test_one_cycle_matches_spec_values_with_momentum():
    opt = _opt()
    sched = OneCycle(opt, 0.1, 1.0, decay_lr_rate=0.5, cycle_first_step_size=4, decay_step_size=2)
    lrs, moms = [], []
    for _ in range(12):
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
        moms.append(opt.param_groups[0]["betas"])
    assert lrs == pytest.approx(
        [0.325, 0.55, 0.775, 1.0, 0.775, 0.55, 0.325, 0.1, 0.08, 0.1 / 1.5, 0.1 / 1.75, 0.05]
    )
    assert [b1 for b1, _ in moms] == pytest.approx(
        [0.875, 0.85, 0.825, 0.8, 0.825, 0.85, 0.875, 0.9, 0.9, 0.9, 0.9, 0.9]
    )
    assert all(b2 == 0.99 for _, b2 in moms)


def test_one_cycle_formula_many_iterations_asymmetric():
    lo, hi, first, second = 0.01, 0.2, 7, 11
    sched = OneCycle(
        _opt(),
        lo,
        hi,
        decay_lr_rate=0.3,
        cycle_first_step_size=first,
        cycle_second_step_size=second,
        decay_step_size=5,
        decay_mom_rate=0.01,
    )
    total = first + second
    for lbi in range(60):
        sched.step()
        lr = sched.optimizer.param_groups[0]["lr"]
        b1 = sched.optimizer.param_groups[0]["betas"][0]
        if lbi < total:
            x = (lbi + 1) / total
            sf = x / (first / total) if x <= first / total else (x - 1) / (first / total - 1)
            assert lr == pytest.approx(lo + (hi - lo) * sf)
            assert b1 == pytest.approx(0.9 - 0.1 * sf)
        else:
            d = (lbi - total + 1) / 5
            assert lr == pytest.approx(lo / (1 + 0.3 * d))
            assert b1 == pytest.approx(0.9 * (1 + 0.01 * d))


def test_one_cycle_stairs_hold_lr_flat():
    sched = OneCycle(_opt(), 0.0, 1.0, cycle_first_step_size=6, cycle_first_stair_count=3)
    lrs = _lrs_after_steps(sched, 12)
    assert lrs == pytest.approx([0.0, 1 / 3, 1 / 3, 2 / 3, 2 / 3, 1.0, 2 / 3, 2 / 3, 1 / 3, 1 / 3, 0.0, 0.0])


def test_one_cycle_without_betas_warns_and_leaves_momentum():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.5)
    with pytest.warns(UserWarning, match="momentum cycling is disabled"):
        OneCycle(opt, 0.01, 0.1).step()
    assert "betas" not in opt.param_groups[0]


def test_lr_range_test_matches_spec_values():
    cont = LRRangeTest(_opt(), 0.01, 2, 1.0, False)
    assert _lrs_after_steps(cont, 4) == pytest.approx([0.015, 0.02, 0.025, 0.03])
    stair = LRRangeTest(_opt(), 0.01, 2, 1.0, True)
    assert _lrs_after_steps(stair, 6) == pytest.approx([0.01, 0.02, 0.02, 0.03, 0.03, 0.04])


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (WarmupLR, dict(warmup_num_steps=7)),
        (WarmupDecayLR, dict(total_num_steps=30, warmup_num_steps=7)),
        (WarmupCosineLR, dict(total_num_steps=30, warmup_num_steps=7)),
        (
            OneCycle,
            dict(
                cycle_min_lr=0.01,
                cycle_max_lr=0.1,
                cycle_first_step_size=5,
                decay_step_size=3,
                decay_lr_rate=0.1,
            ),
        ),
        (LRRangeTest, dict(lr_range_test_step_size=3)),
    ],
)
def test_state_round_trip_continues_identically(cls, kwargs):
    a = cls(_opt(), **kwargs)
    _lrs_after_steps(a, 13)
    b = cls(_opt(), **kwargs)
    b.load_state_dict(a.state_dict())
    assert b.optimizer.param_groups[0]["lr"] == pytest.approx(a.optimizer.param_groups[0]["lr"])
    assert _lrs_after_steps(b, 20) == pytest.approx(_lrs_after_steps(a, 20))


def test_step_with_explicit_iteration_and_per_group_values():
    sched = WarmupLR(
        _opt(groups=2),
        warmup_min_lr=[0.0, 0.1],
        warmup_max_lr=[1.0, 0.2],
        warmup_num_steps=4,
        warmup_type="linear",
    )
    sched.step(2)
    assert sched.get_last_lr() == pytest.approx([0.5, 0.15])
    with pytest.raises(ValueError, match="expected 2 values"):
        WarmupLR(_opt(groups=2), warmup_min_lr=[0.0, 0.1, 0.2])


def test_build_scheduler_by_section_name_and_torch_class():
    section = SchedulerConfig(type="WarmupLR", params={"warmup_num_steps": 10, "warmup_type": "linear"})
    sched = scheduler_from_config(_opt(), section)
    assert isinstance(sched, WarmupLR) and sched.warmup_type == "linear"
    assert isinstance(WarmupLR.from_config(_opt(), section), WarmupLR)
    step_lr = build_scheduler(_opt(), "StepLR", {"step_size": 2, "gamma": 0.5})
    assert isinstance(step_lr, torch.optim.lr_scheduler.StepLR)


def test_build_scheduler_unwraps_a_wrapper_for_torch_schedulers():
    wrapper = types.SimpleNamespace(optimizer=_opt())
    sched = build_scheduler(wrapper, "ExponentialLR", {"gamma": 0.5})
    sched.step()
    assert wrapper.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)


def test_build_scheduler_errors_name_the_fix():
    with pytest.raises(OptimizerConfigError, match="WarmupLR"):
        build_scheduler(_opt(), "WarmupLRR")
    with pytest.raises(OptimizerConfigError, match="accepted params: .*warmup_num_steps"):
        build_scheduler(_opt(), "WarmupLR", {"warmup_steps": 10})
