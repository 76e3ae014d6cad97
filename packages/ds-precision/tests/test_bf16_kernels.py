"""The optional Numba bf16 path: kernels against torch, bit-identical training, fallback without numba."""

import math
import sys

import pytest
import torch
from ds_precision import MixedPrecisionOptimizer
from ds_precision._optimizer import _load_kernels

try:
    from ds_precision import _bf16_kernels as kernels
except ImportError:  # numba is the optional [fast] extra: the torch path's tests below still run
    kernels = None
needs_numba = pytest.mark.skipif(kernels is None, reason="pip install 'ds-precision[fast]' (numba)")

SPECIAL = [0.0, -0.0, 1.0, -2.5, math.inf, -math.inf, math.nan, 1e-40, -1e-39, 3.38e38, 65504.0]


def odd_sized_bf16(seed):
    """Sizes that straddle the chunk size, with inf/nan/subnormal values scattered in."""
    g = torch.Generator().manual_seed(seed)
    sizes = [1, 7, kernels.CHUNK_ELEMS, kernels.CHUNK_ELEMS + 3, 2 * kernels.CHUNK_ELEMS + 1000]
    out = [torch.randn(n, generator=g).bfloat16() * 10.0 ** float(i - 2) for i, n in enumerate(sizes)]
    out[-1][: len(SPECIAL)] = torch.tensor(SPECIAL).bfloat16()
    return out


@needs_numba
def test_copy_scaled_is_bit_identical_to_torch_copy_then_multiply():
    src = odd_sized_bf16(0)
    for inv in (1.0, 1 / 7.3, 2.0**-20, 3.0e30):
        dst = [torch.empty(t.numel()) for t in src]
        kernels.copy_scaled_to_fp32(dst, src, inv)
        for d, s in zip(dst, src):
            ref = s.float() * inv
            assert torch.equal(d.view(torch.int32), ref.view(torch.int32)) or (
                torch.equal(d.isnan(), ref.isnan()) and torch.equal(d[~d.isnan()], ref[~ref.isnan()])
            )


@needs_numba
def test_round_to_bf16_matches_torch_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    n = 3 * kernels.CHUNK_ELEMS + 17
    src = torch.randn(n, generator=g) * torch.logspace(-44, 38, n, dtype=torch.float64).float()
    specials = [*SPECIAL, -math.nan, 3.4028235e38, 1.00390625, 1.01171875, 1.0 + 2**-8, 1.0 + 3 * 2**-8]
    src[: len(specials)] = torch.tensor(specials)  # ties round to even; the largest fp32 rounds to inf
    src[-5:] = torch.tensor([-math.inf, math.nan, 0.0, -1e-45, 1.0 + 2**-9])
    dst = torch.empty(n, dtype=torch.bfloat16)
    kernels.copy_to_bf16(dst, src)
    assert torch.equal(dst.view(torch.int16), src.to(torch.bfloat16).view(torch.int16))


@needs_numba
def test_sum_of_squares_matches_fp64_reference_and_propagates_nonfinite():
    src = odd_sized_bf16(2)
    src[-1][: len(SPECIAL)] = 0.5
    ref = sum(t.double().square().sum().item() for t in src)
    assert kernels.sum_of_squares(src) == pytest.approx(ref, rel=1e-12)
    assert kernels.sum_of_squares([]) == 0.0
    for bad in (math.inf, math.nan):
        src[3][5] = bad
        assert not math.isfinite(kernels.sum_of_squares(src))


def _train_big_bf16(numba_kernels, clip_grad, steps=3):
    torch.manual_seed(0)
    # 2 chunks + a tail, and a bias: several tensors of odd sizes
    model = torch.nn.Sequential(torch.nn.Linear(96, 1400), torch.nn.Tanh(), torch.nn.Linear(1400, 3))
    model = model.to(torch.bfloat16)
    opt = MixedPrecisionOptimizer(
        torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01),
        dtype=torch.bfloat16,
        clip_grad=clip_grad,
        numba_kernels=numba_kernels,
    )
    g = torch.Generator().manual_seed(3)
    trace = []
    # the fp32 gradient buffer lives only inside the step: read it as the inner optimizer sees it
    master_grads = []
    opt.optimizer.register_step_pre_hook(lambda *_: master_grads.append(opt.groups[0].flat_grad.clone()))
    for _ in range(steps):
        x = torch.randn(16, 96, generator=g).bfloat16()
        opt.backward(model(x).float().pow(2).mean())
        model_grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert opt.step()
        flat = opt.groups[0]
        assert flat.flat_grad is None  # freed by the step
        trace.append((opt.global_grad_norm, model_grads, master_grads[-1], flat.flat_master.clone()))
        assert torch.equal(flat.flat_model.view(torch.int16), flat.flat_master.bfloat16().view(torch.int16))
        opt.zero_grad()
    return trace, opt


@needs_numba
def test_numba_path_is_bit_identical_to_the_torch_path_without_clipping():
    fast, fast_opt = _train_big_bf16(True, clip_grad=100.0)
    slow, slow_opt = _train_big_bf16(False, clip_grad=100.0)
    assert fast_opt._kernels is not None and slow_opt._kernels is None
    for (fast_norm, _, fast_grad, fast_master), (slow_norm, _, slow_grad, slow_master) in zip(fast, slow):
        assert slow_norm < 100.0
        assert fast_norm == pytest.approx(slow_norm, rel=1e-6)  # summation order only
        assert torch.equal(fast_grad, slow_grad)
        assert torch.equal(fast_master, slow_master)
    for sa, sb in zip(fast_opt.state.values(), slow_opt.state.values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


@needs_numba
def test_numba_path_with_clipping_applies_exactly_the_torch_multiply():
    # the clip coefficient comes from the norm, whose last bits depend on the summation order, so
    # the two paths' coefficients may differ by an ulp; given the coefficient, the grads are exact
    fast, _ = _train_big_bf16(True, clip_grad=1e-3)
    slow, _ = _train_big_bf16(False, clip_grad=1e-3)
    for norm, model_grads, master_grads, _ in fast:
        assert norm > 1e-3
        inv = 1.0 / ((norm + 1e-6) / 1e-3)
        assert torch.equal(master_grads, model_grads.float() * inv)
    drift = (fast[-1][3] - slow[-1][3]).abs().max().item()
    assert drift < 1e-6, drift


@needs_numba
def test_nan_gradient_on_the_numba_path_skips_the_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(300, 300).to(torch.bfloat16)
    opt = MixedPrecisionOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), dtype=torch.bfloat16, clip_grad=1.0, numba_kernels=True
    )
    before = model.weight.detach().clone()
    opt.backward(model(torch.randn(4, 300).bfloat16()).float().sum())
    model.weight.grad.view(-1)[kernels.CHUNK_ELEMS + 5] = math.nan
    assert not opt.step()
    assert opt.skipped_steps == 1 and torch.equal(model.weight.detach(), before)


def test_without_numba_the_torch_path_runs_and_true_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # what `import numba` sees when it is missing
    monkeypatch.delitem(sys.modules, "ds_precision._bf16_kernels", raising=False)
    assert _load_kernels(None) is None
    with pytest.raises(ImportError, match=r"pip install 'ds-precision\[fast\]'"):
        _load_kernels(True)
    model = torch.nn.Linear(4, 2).to(torch.bfloat16)
    opt = MixedPrecisionOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), dtype=torch.bfloat16)
    assert opt._kernels is None
    opt.backward(model(torch.randn(3, 4).bfloat16()).sum())
    assert opt.step()


def test_kernels_are_not_loaded_for_fp16_fp32_or_when_disabled():
    for dtype, wanted in ((torch.float16, True), (torch.float32, True), (torch.bfloat16, False)):
        model = torch.nn.Linear(4, 2).to(dtype)
        opt = MixedPrecisionOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), dtype=dtype, numba_kernels=wanted
        )
        assert opt._kernels is None
