"""Loss-scaler traces: V19 growth, hysteresis, consecutive hysteresis, minimum, state round trip."""

import json
import random
from types import SimpleNamespace

import pytest
from ds_precision import (
    DynamicLossScaler,
    OverflowAtMinimumScaleError,
    StaticLossScaler,
    loss_scaler_from_config,
)

O, N = True, False  # noqa: E741 (O = overflow, N = no overflow, as in the spec traces)


def trace(scaler, pattern):
    out = []
    for overflow in pattern:
        scaler.update_scale(overflow)
        out.append(scaler.loss_scale)
    return out


def trace_h(scaler, pattern):
    out = []
    for overflow in pattern:
        scaler.update_scale(overflow)
        out.append((scaler.loss_scale, scaler.cur_hysteresis))
    return out


def test_defaults_follow_decisions():
    s = DynamicLossScaler()
    assert s.loss_scale == 2.0**32
    assert (s.scale_window, s.delayed_shift, s.min_scale) == (1000, 2, 1.0)


def test_v19_growth_trace_from_spec():
    # docs/design.md §2, [V19]: window 3 start 8 clean x7 -> 8,8,8,16,16,16,32
    s = DynamicLossScaler(initial_scale_power=3, loss_scale_window=3, hysteresis=1)
    assert trace(s, [N] * 7) == [8, 8, 8, 16, 16, 16, 32]


def test_overflow_then_clean_grows_on_window_plus_one_th_clean_step():
    # the spec's (B) trace 4,4,4,8,8,8,16 shifted by V19's off-by-one
    s = DynamicLossScaler(initial_scale_power=3, loss_scale_window=3, hysteresis=1)
    assert trace(s, [O] + [N] * 6) == [4, 4, 4, 4, 8, 8, 8]


def test_default_window_first_growth_at_step_1000():
    s = DynamicLossScaler(initial_scale_power=4)
    scales = trace(s, [N] * 1001)
    assert scales[999] == 16 and scales[1000] == 32


def test_hysteresis_trace():
    # spec: hysteresis 2, window 3, start 64: O,O,O,N,N,N,N; growth one step later than (B)
    s = DynamicLossScaler(initial_scale_power=6, loss_scale_window=3, hysteresis=2)
    assert trace_h(s, [O, O, O, N, N, N, N]) == [
        (64, 1),
        (32, 1),
        (16, 1),
        (16, 1),
        (16, 1),
        (16, 1),
        (32, 2),
    ]


def test_consecutive_hysteresis_refills_every_clean_step():
    s = DynamicLossScaler(
        initial_scale_power=6, loss_scale_window=3, hysteresis=2, consecutive_hysteresis=True
    )
    assert trace_h(s, [O, N, O, N, O]) == [(64, 1), (64, 2), (64, 1), (64, 2), (64, 1)]


def test_non_consecutive_hysteresis_is_not_refilled_by_clean_steps():
    s = DynamicLossScaler(initial_scale_power=6, loss_scale_window=3, hysteresis=2)
    assert trace(s, [O, N, O, N, O]) == [64, 64, 32, 32, 16]


def test_hysteresis_three_absorbs_two_overflows_then_halves():
    s = DynamicLossScaler(initial_scale_power=6, loss_scale_window=100, hysteresis=3)
    assert trace_h(s, [O, O, O, O]) == [(64, 2), (64, 1), (32, 1), (16, 1)]


def test_overflow_restarts_the_window():
    s = DynamicLossScaler(initial_scale_power=3, loss_scale_window=2, hysteresis=1)
    # N,N,N grows at the 3rd clean step; an overflow in between restarts the count
    assert trace(s, [N, N, O, N, N, N, N, N]) == [8, 8, 4, 4, 4, 8, 8, 16]


def test_scale_stops_at_minimum_and_overflow_there_only_skips():
    s = DynamicLossScaler(initial_scale_power=2, hysteresis=1, min_loss_scale=1, max_overflows_at_min_scale=5)
    assert trace(s, [O, O, O, O]) == [2, 1, 1, 1]
    assert s.overflows_at_min_scale == 2


def test_fractional_minimum():
    s = DynamicLossScaler(initial_scale_power=1, hysteresis=1, min_loss_scale=0.25)
    assert trace(s, [O, O, O, O]) == [1, 0.5, 0.25, 0.25]


def test_stops_after_limit_of_consecutive_overflows_at_minimum():
    s = DynamicLossScaler(initial_scale_power=1, hysteresis=1, max_overflows_at_min_scale=3)
    trace(s, [O, O, O])  # 1 (not yet at min when it overflowed), then two at the minimum
    with pytest.raises(OverflowAtMinimumScaleError) as err:
        s.update_scale(True)
    assert err.value.consecutive == 3 and "bf16" in str(err.value)


def test_clean_step_resets_the_streak_at_minimum():
    s = DynamicLossScaler(initial_scale_power=0, hysteresis=1, max_overflows_at_min_scale=2)
    trace(s, [O, N, O, N, O])  # never two in a row: no error
    assert s.overflows_at_min_scale == 1


def test_max_loss_scale_caps_growth():
    s = DynamicLossScaler(initial_scale_power=3, loss_scale_window=1, hysteresis=1, max_loss_scale=32)
    assert trace(s, [N] * 8) == [8, 16, 32, 32, 32, 32, 32, 32]


def test_state_dict_is_plain_json_and_resumes_identically():
    rng = random.Random(0)
    pattern = [rng.random() < 0.3 for _ in range(200)]
    kw = dict(initial_scale_power=10, loss_scale_window=4, hysteresis=2, max_overflows_at_min_scale=1000)
    a = DynamicLossScaler(**kw)
    trace(a, pattern[:77])
    saved = json.loads(json.dumps(a.state_dict()))
    rest_a = trace_h(a, pattern[77:])
    b = DynamicLossScaler(**kw)
    b.load_state_dict(saved)
    assert trace_h(b, pattern[77:]) == rest_a


def test_static_scaler_never_moves_but_stops_after_repeated_overflows():
    s = StaticLossScaler(128.0, max_overflows_at_min_scale=3)
    assert trace(s, [O, O, N, O, O]) == [128.0] * 5
    with pytest.raises(OverflowAtMinimumScaleError):
        s.update_scale(True)


def test_static_and_dynamic_states_do_not_mix():
    with pytest.raises(ValueError, match="static"):
        DynamicLossScaler().load_state_dict(StaticLossScaler(4.0).state_dict())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(loss_scale_window=0), "loss_scale_window"),
        (dict(hysteresis=0), "hysteresis"),
        (dict(min_loss_scale=0), "min_loss_scale"),
        (dict(max_overflows_at_min_scale=0), "max_overflows_at_min_scale"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DynamicLossScaler(**kwargs)


def _fp16_section(**over):
    fields = dict(
        enabled=True,
        loss_scale=0.0,
        initial_scale_power=32,
        loss_scale_window=1000,
        hysteresis=2,
        consecutive_hysteresis=False,
        min_loss_scale=1,
    )
    fields.update(over)
    try:
        from ds_config import FP16Config  # the real section model once it exists
    except ImportError:
        return SimpleNamespace(**fields)
    return FP16Config(**fields)


def test_from_config_maps_every_field():
    s = DynamicLossScaler.from_config(
        _fp16_section(
            initial_scale_power=12,
            loss_scale_window=50,
            hysteresis=3,
            consecutive_hysteresis=True,
            min_loss_scale=2,
        )
    )
    assert (s.loss_scale, s.scale_window, s.delayed_shift, s.consecutive_hysteresis, s.min_scale) == (
        4096,
        50,
        3,
        True,
        2,
    )


def test_loss_scaler_from_config_picks_static_or_dynamic():
    assert isinstance(loss_scaler_from_config(_fp16_section()), DynamicLossScaler)
    static = loss_scaler_from_config(_fp16_section(loss_scale=512.0))
    assert isinstance(static, StaticLossScaler) and static.loss_scale == 512.0
