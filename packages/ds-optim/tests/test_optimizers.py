"""Adam/AdamW, CPUAdam and Lamb against straightforward references; build_optimizer's errors and routing."""

from __future__ import annotations

import types

import pytest
import torch
from ds_optim import (
    CPUAdam,
    FusedAdam,
    Lamb,
    OptimizerConfigError,
    _cpu_adam,
    build_optimizer,
    optimizer_from_config,
)

STEPS = 60


def _params(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(7, 5, generator=gen), torch.randn(13, generator=gen), torch.zeros(4)]


def _grads(seed: int = 1) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (13,), (4,)]
    return [[torch.randn(s, generator=gen) * 0.1 for s in shapes] for _ in range(STEPS)]


def _run(opt_factory, grads, **step_kwargs):
    params = [torch.nn.Parameter(p.clone()) for p in _params()]
    opt = opt_factory(params)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step(**step_kwargs)
    return [p.detach() for p in params], opt


def ref_adam(grads, lr, betas, eps, wd, decoupled, bias_correction):
    """Adam written out element-wise in float64."""
    b1, b2 = betas
    params = [p.double() for p in _params()]
    ms = [torch.zeros_like(p) for p in params]
    vs = [torch.zeros_like(p) for p in params]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            g = g.double()
            if not decoupled:
                g = g + wd * params[i]
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            m_hat, v_hat = ms[i], vs[i]
            if bias_correction:
                m_hat, v_hat = ms[i] / (1 - b1**t), vs[i] / (1 - b2**t)
            if decoupled:
                params[i] = params[i] * (1 - lr * wd)
            params[i] = params[i] - lr * m_hat / (v_hat.sqrt() + eps)
    return [p.float() for p in params]


def ref_lamb(grads, lr, betas, eps, weight_decay, max_coeff, min_coeff, bias_correction=True):
    """LAMB written out per tensor in float64."""
    b1, b2 = betas
    params = [p.double() for p in _params()]
    ms = [torch.zeros_like(p) for p in params]
    vs = [torch.zeros_like(p) for p in params]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            g = g.double()
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            u = ms[i] / (vs[i].sqrt() + eps) + weight_decay * params[i]
            p_norm, u_norm = params[i].norm().item(), u.norm().item()
            trust = 1.0 if p_norm == 0 or u_norm == 0 else min(max(p_norm / u_norm, min_coeff), max_coeff)
            step_size = lr * (1 - b2**t) ** 0.5 / (1 - b1**t) if bias_correction else lr
            params[i] = params[i] - step_size * trust * u
    return [p.float() for p in params]


def _assert_close(actual, expected, atol=2e-5):
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=atol, rtol=1e-4)


HP = dict(lr=3e-2, betas=(0.8, 0.99), eps=1e-8)


@pytest.mark.parametrize("decoupled", [True, False])
def test_built_adam_matches_reference_and_torch(decoupled):
    grads = _grads()
    section = {"lr": HP["lr"], "betas": list(HP["betas"]), "eps": HP["eps"], "weight_decay": 0.05}
    if not decoupled:
        section["adam_w_mode"] = False
    actual, opt = _run(lambda ps: build_optimizer(ps, "Adam", section), grads)
    assert type(opt) is FusedAdam and opt.adam_w_mode == int(decoupled)  # DeepSpeed's class for config Adam
    _assert_close(actual, ref_adam(grads, wd=0.05, decoupled=decoupled, bias_correction=True, **HP))
    torch_cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    plain, _ = _run(lambda ps: torch_cls(ps, weight_decay=0.05, **HP), grads)
    _assert_close(actual, plain, atol=1e-6)


def test_adamw_type_is_decoupled_even_with_adam_w_mode_false_and_defaults_match_deepspeed():
    params = [torch.nn.Parameter(torch.zeros(2))]
    opt = build_optimizer(params, "AdamW", {"adam_w_mode": False})
    assert type(opt) is FusedAdam and opt.adam_w_mode == 1
    assert opt.defaults["weight_decay"] == 0.0 and opt.defaults["lr"] == 1e-3


@pytest.mark.parametrize("decoupled", [True, False])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_cpu_adam_matches_reference(decoupled, bias_correction):
    grads = _grads()
    actual, _ = _run(
        lambda ps: CPUAdam(
            ps, weight_decay=0.05, bias_correction=bias_correction, adamw_mode=decoupled, **HP
        ),
        grads,
    )
    _assert_close(
        actual, ref_adam(grads, wd=0.05, decoupled=decoupled, bias_correction=bias_correction, **HP)
    )


def test_adam_without_bias_correction_is_built_on_cpu_adam():
    grads = _grads()
    actual, opt = _run(lambda ps: build_optimizer(ps, "Adam", {"bias_correction": False, **HP}), grads)
    assert isinstance(opt, CPUAdam)
    _assert_close(actual, ref_adam(grads, wd=0.0, decoupled=True, bias_correction=False, **HP))


@pytest.fixture(params=["one_pass", "two_pass"])
def copy_path(request, monkeypatch):
    """Run a test on the Numba one-pass kernel (skipped without numba) and on the torch fallback."""
    if request.param == "one_pass":
        pytest.importorskip("numba")
        module = _cpu_adam._load_numba_adam()
        calls = []

        def counting(*args, **kwargs):
            calls.append(1)
            return module.adam_step_with_copy(*args, **kwargs)

        monkeypatch.setattr(_cpu_adam, "_load_numba_adam", lambda: _Spy(module, counting))
        return calls
    monkeypatch.setattr(_cpu_adam, "_load_numba_adam", lambda: None)
    return None


class _Spy:
    def __init__(self, module, step):
        self.DTYPES = module.DTYPES
        self.adam_step_with_copy = step


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16) if x.element_size() == 2 else x.view(torch.int32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("decoupled", [True, False])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_cpu_adam_writes_low_precision_copy(dtype, decoupled, bias_correction, copy_path):
    grads = _grads()
    lowp = [torch.empty(p.shape, dtype=dtype) for p in _params()]
    actual, _ = _run(
        lambda ps: CPUAdam(
            ps, weight_decay=0.01, adamw_mode=decoupled, bias_correction=bias_correction, **HP
        ),
        grads,
        lowp_params=lowp,
    )
    _assert_close(
        actual, ref_adam(grads, wd=0.01, decoupled=decoupled, bias_correction=bias_correction, **HP)
    )
    for p, q in zip(actual, lowp):
        assert torch.equal(_bits(q), _bits(p.to(dtype)))
    if copy_path is not None:  # bf16 goes through the one-pass kernel, fp16 stays on the torch path
        assert len(copy_path) == (len(grads) * len(lowp) if dtype == torch.bfloat16 else 0)


def test_cpu_adam_bf16_copy_is_bit_identical_for_ties_nan_inf_and_subnormals(copy_path):
    """Every fp32 bit class: ties to even, values that round up to inf, NaNs with any payload and sign."""
    gen = torch.Generator().manual_seed(3)
    random_bits = torch.randint(-(2**31), 2**31 - 1, (20_000,), generator=gen, dtype=torch.int64)
    ties = (random_bits[:4000] & ~0xFFFF) | 0x8000  # exactly halfway between two bf16 values
    special = torch.tensor(
        [0x7F7FFFFF, 0x7F7F8000, 0x7F800000, 0x7F800001, 0x7FFFFFFF, 0x00000001, 0x007F8000]
    )
    bits = torch.cat([random_bits, ties, special, -special]).to(torch.int32)
    p = torch.nn.Parameter(bits.view(torch.float32).clone())
    p.grad = torch.randn(p.shape, generator=gen)
    p.grad[:50] = float("nan")
    q = torch.empty(p.shape, dtype=torch.bfloat16)
    opt = CPUAdam([p], lr=0.0)  # lr 0 keeps most weights bit for bit, so the special patterns are cast
    for _ in range(2):
        opt.step(lowp_params=[q])
    assert torch.equal(_bits(q), _bits(p.detach().to(torch.bfloat16)))
    finite = bits.view(torch.float32).isfinite()
    finite[:50] = False  # NaN gradients turn these weights into NaN
    kept = torch.equal(_bits(p.detach())[finite], bits[finite])
    assert kept, "lr=0 should leave finite weights unchanged, so the special bit patterns were tested"


def test_cpu_adam_rejects_mismatched_lowp_params():
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match="shape"):
        CPUAdam([p]).step(lowp_params=[torch.zeros(4, dtype=torch.bfloat16)])


@pytest.mark.parametrize("step_as_int", [False, True])
def test_cpu_adam_state_round_trip_continues_identically(step_as_int):
    """Saved after 30 steps and loaded into a new CPUAdam, the run goes on as if uninterrupted; also when the
    saved ``step`` is a number (DeepSpeed's FusedAdam saves an int: an imported DeepSpeed checkpoint)."""
    grads = _grads()
    full, _ = _run(lambda ps: CPUAdam(ps, **HP), grads)
    params = [torch.nn.Parameter(p.clone()) for p in _params()]
    first = CPUAdam(params, **HP)
    for step_grads in grads[:30]:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        first.step()
    saved = first.state_dict()
    if step_as_int:
        for st in saved["state"].values():
            st["step"] = int(st["step"])
    second = CPUAdam(params, **HP)
    second.load_state_dict(saved)
    for step_grads in grads[30:]:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        second.step()
    _assert_close([p.detach() for p in params], full, atol=1e-7)


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_lamb_matches_reference(wd):
    grads = _grads()
    kwargs = dict(lr=2e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=wd, max_coeff=1.5, min_coeff=0.3)
    actual, opt = _run(lambda ps: build_optimizer(ps, "Lamb", kwargs), grads)
    assert isinstance(opt, Lamb)
    _assert_close(actual, ref_lamb(grads, **kwargs))


def test_lamb_trust_ratio_clamps_and_is_one_for_zero_norms():
    params = [torch.tensor([100.0, 0.0]), torch.tensor([1e-6, 0.0]), torch.zeros(2)]
    updates = [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0]), torch.ones(2)]
    trust = Lamb._trust_ratios(params, updates, min_coeff=0.01, max_coeff=10.0)
    assert trust.tolist() == pytest.approx([10.0, 0.01, 1.0])


def test_lamb_state_round_trip():
    grads = _grads()
    full, _ = _run(lambda ps: Lamb(ps, lr=1e-2), grads)
    params = [torch.nn.Parameter(p.clone()) for p in _params()]
    first = Lamb(params, lr=1e-2)
    for step_grads in grads[:25]:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        first.step()
    second = Lamb(params, lr=1e-2)
    second.load_state_dict(first.state_dict())
    for step_grads in grads[25:]:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        second.step()
    _assert_close([p.detach() for p in params], full, atol=1e-7)


def test_max_grad_norm_points_to_gradient_clipping():
    with pytest.raises(OptimizerConfigError, match="gradient_clipping"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], "Adam", {"max_grad_norm": 1.0})


def test_unknown_optimizer_lists_the_known_ones():
    with pytest.raises(
        OptimizerConfigError, match=r"known: Adam, AdamW, Lamb, OneBitAdam, Adagrad, .*torch.optim.SGD"
    ):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], "Adamm")
    with pytest.raises(OptimizerConfigError, match="does not provide"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], "ZeroOneAdam")


def test_unknown_param_lists_the_accepted_ones():
    with pytest.raises(OptimizerConfigError, match="accepted params: .*max_coeff"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], "Lamb", {"max_coef": 2.0})


def test_any_torch_optimizer_by_exact_name():
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))], "SGD", {"lr": 0.1, "momentum": 0.9})
    assert type(opt) is torch.optim.SGD and opt.defaults["momentum"] == 0.9
    with pytest.raises(OptimizerConfigError):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], "sgd")
    assert type(build_optimizer([torch.nn.Parameter(torch.zeros(1))], "adagrad")) is torch.optim.Adagrad


def test_cpu_offload_builds_cpu_adam_with_deepspeed_modes():
    p = [torch.nn.Parameter(torch.zeros(1))]
    opt = build_optimizer(p, "Adam", {"adam_w_mode": False, "lr": 0.1}, cpu_offload=True)
    assert isinstance(opt, CPUAdam) and opt.defaults["adamw_mode"] is False and opt.defaults["lr"] == 0.1


def test_from_config_with_the_section_model_only():
    p = [torch.nn.Parameter(torch.zeros(1))]
    section = types.SimpleNamespace(type="Lamb", params={"lr": 0.01, "max_coeff": 3.0})
    with pytest.raises(TypeError, match="OptimizerConfig"):
        optimizer_from_config(p, section)
    ds_config = pytest.importorskip("ds_config")
    lamb = ds_config.OptimizerConfig(type="Lamb", params={"lr": 0.01, "max_coeff": 3.0})
    assert optimizer_from_config(p, lamb).defaults["max_coeff"] == 3.0
    real = ds_config.OptimizerConfig(
        type="Adam", params={"lr": 0.002, "betas": [0.8, 0.999], "adam_w_mode": False}
    )
    opt = build_optimizer(p, real)
    assert type(opt) is FusedAdam and opt.adam_w_mode == 0 and opt.defaults["lr"] == 0.002
