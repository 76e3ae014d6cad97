"""The FlexAttention path against the CPU (torch) path: every layout, masks, rpe, forward and gradients.

torch refuses FlexAttention inputs that require grad on CPU at its public entry (`_validate_device`), though
the eager implementation below it is device-agnostic; to check this path's BlockMask and score_mod in the
backward pass on CPU, these tests lift that guard and run FlexAttention eagerly (uncompiled). One test
compiles it (forward, as torch supports on CPU). On a GPU, tools/gpu_check.sh runs the compiled path.
"""

from __future__ import annotations

import logging

import pytest
import torch
from ds_sparse_attn import SparseSelfAttention, _backend, _flex_attention
from test_attention import CONFIGS

flex_module = pytest.importorskip("torch.nn.attention.flex_attention")

SEQ, DIM = 32, 8


@pytest.fixture
def eager_flex(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flex_module, "_validate_device", lambda *args: None)
    monkeypatch.setattr(_flex_attention, "compiled", lambda: flex_module.flex_attention)
    monkeypatch.setattr(flex_module, "_warn_once", lambda *args, **kwargs: None)
    monkeypatch.setattr(_backend, "flex_problem", lambda *args: None)


def _run(backend: str, config, dtype: torch.dtype, seed: int = 0, **masks):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, SEQ, DIM, generator=g).to(dtype).requires_grad_() for _ in range(3))
    module = SparseSelfAttention(config, max_seq_length=SEQ, backend=backend, **masks.pop("modes", {}))
    extra = {name: (t.clone().requires_grad_() if name == "rpe" else t) for name, t in masks.items()}
    out = module(q, k, v, **extra)
    out.float().backward(torch.linspace(-1, 1, SEQ)[:, None].expand(out.shape))
    grads = [q.grad, k.grad, v.grad] + ([extra["rpe"].grad] if "rpe" in extra else [])
    return module, [out.float()] + [t.float() for t in grads]


@pytest.mark.parametrize("attention", ["bidirectional", "unidirectional"])
@pytest.mark.parametrize("name", ["dense", "fixed", "variable", "bigbird", "bslongformer"])
def test_flex_matches_torch_path(eager_flex: None, name: str, attention: str) -> None:
    config = CONFIGS[name](attention)
    module, flex = _run("flex", config, torch.float32)
    _, reference = _run("torch", config, torch.float32)
    assert "cpu float32: flex" in repr(module)
    for actual, expected in zip(flex, reference):
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["add", "mul"])
def test_flex_masks_and_rpe(eager_flex: None, mode: str) -> None:
    g = torch.Generator().manual_seed(5)
    key_padding = (torch.rand(2, SEQ, generator=g) > 0.3).float()
    attn = (torch.rand(SEQ, SEQ, generator=g) > 0.2).float()
    if mode == "add":
        key_padding, attn = key_padding.log(), attn.log()  # 0 -> -inf, 1 -> 0
    key_padding[1] = 0.0 if mode == "mul" else float("-inf")  # batch 1: every key masked out, zeros out
    rpe = torch.randn(3, SEQ, SEQ, generator=g)
    config = CONFIGS["bigbird"]("bidirectional")
    masks = {"rpe": rpe, "key_padding_mask": key_padding, "attn_mask": attn}
    modes = {"key_padding_mask_mode": mode, "attn_mask_mode": mode}
    _, flex = _run("flex", config, torch.float32, modes=modes, **masks)
    _, reference = _run("torch", config, torch.float32, modes=modes, **masks)
    assert (flex[0][1] == 0).all()
    for actual, expected in zip(flex, reference):
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flex_half_precision(eager_flex: None, dtype: torch.dtype) -> None:
    config = CONFIGS["fixed"]("bidirectional")
    _, flex = _run("flex", config, dtype)
    _, reference = _run("torch", config, torch.float32)
    for actual, expected in zip(flex, reference):
        torch.testing.assert_close(actual, expected, atol=3e-2, rtol=3e-2)


def test_flex_on_cpu_with_grad_falls_back_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    config = CONFIGS["fixed"]("bidirectional")
    with caplog.at_level(logging.WARNING, logger="ds_sparse_attn"):
        module, _ = _run("flex", config, torch.float32, seed=1)
    assert "cpu float32: torch" in repr(module)
    lines = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    assert lines and "no FlexAttention backward on CPU" in lines[0] and "\n" not in lines[0]


def test_environment_variable_forces_a_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_backend.ENV_VAR, "torch-gather")
    module, _ = _run("auto", CONFIGS["fixed"]("bidirectional"), torch.float32)
    assert "cpu float32: torch-gather" in repr(module)
    monkeypatch.setenv(_backend.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="DS_SPARSE_ATTN_BACKEND='fast'"):
        SparseSelfAttention()


def test_auto_on_cpu_is_the_torch_path() -> None:
    module, _ = _run("auto", CONFIGS["fixed"]("bidirectional"), torch.float32)
    assert "cpu float32: torch" in repr(module)


def test_compiled_flex_forward_on_cpu() -> None:
    """torch.compile(flex_attention) on CPU (inductor, C++), forward only as torch allows there."""
    config = CONFIGS["bslongformer"]("bidirectional")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 3, SEQ, DIM, generator=g) for _ in range(3))
    flex = SparseSelfAttention(config, max_seq_length=SEQ, backend="flex")
    with torch.no_grad():
        out = flex(q, k, v)
        reference = SparseSelfAttention(config, max_seq_length=SEQ, backend="torch")(q, k, v)
    assert "cpu float32: flex" in repr(flex)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled FlexAttention with a backward needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [64, 128])
def test_compiled_flex_on_cuda_matches_torch_path(dtype: torch.dtype, dim: int) -> None:
    """On a GPU: backend='flex' compiles (or the test fails: no fallback accepted here), forward and
    gradients with key padding and rpe, against the torch path in fp32."""
    from ds_sparse_attn import BigBirdSparsityConfig

    config = BigBirdSparsityConfig(num_heads=4)  # block 16: tiles of 128 with partial tiles
    seq = 512
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(2, 4, seq, dim, generator=g) for _ in range(3)]
    kp = (torch.rand(2, seq, generator=g) > 0.2).float()
    rpe0 = torch.randn(4, seq, seq, generator=g)
    results = []
    for backend, cast in (("flex", dtype), ("torch", torch.float32)):
        module = SparseSelfAttention(config, key_padding_mask_mode="mul", max_seq_length=seq, backend=backend)
        q, k, v = (t.cuda().to(cast).requires_grad_() for t in base)
        rpe = rpe0.cuda().requires_grad_()
        out = module(q, k, v, rpe=rpe, key_padding_mask=kp.cuda())
        out.float().sum().backward()
        if backend == "flex":
            assert "cuda " + str(dtype).removeprefix("torch.") + ": flex" in repr(module)
        results.append([t.float() for t in (out, q.grad, k.grad, v.grad, rpe.grad)])
    for actual, expected in zip(*results):
        torch.testing.assert_close(actual, expected, atol=5e-2, rtol=5e-2)
