"""The Numba CUDA kernels of ds-sparse-attn against their torch references and the torch path.

On a machine without a GPU this runs under numba's CUDA simulator, which must be enabled before numba is
imported, so run this file in its own pytest process:

    NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest kernels/test_sparse_attn_kernels.py -q

(the variable is set here too when no GPU is visible). With a GPU and numba-cuda installed, the same tests run
on the device. The simulator checks indexing, bounds and synchronisation logic; it is necessary, not sufficient.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    if "numba" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        pytest.skip(
            "numba was imported before the simulator could be enabled; run this file alone",
            allow_module_level=True,
        )
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

pytest.importorskip("numba.cuda", reason='needs numba-cuda: pip install "ds-sparse-attn[cuda]"')

from ds_sparse_attn import (  # noqa: E402
    BigBirdSparsityConfig,
    FixedSparsityConfig,
    SparseSelfAttention,
    VariableSparsityConfig,
)
from ds_sparse_attn import _cuda_kernels as K  # noqa: E402
from ds_sparse_attn import _kernel_reference as R  # noqa: E402
from ds_sparse_attn._plan import BlockSparsePlan  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SIMULATED = not torch.cuda.is_available()
# The simulator runs every CUDA thread as a Python thread: keep shapes tiny there.
BATCH, HEADS = (1, 1) if SIMULATED else (2, 4)
SEQ = 32 if SIMULATED else 256


def close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual.cpu(), expected.cpu(), atol=atol, rtol=1e-4)


def setup(block: int, dim: int, seed: int = 0):
    config = VariableSparsityConfig(
        HEADS, block, True, num_random_blocks=1, local_window_blocks=[1, 2], global_block_indices=[0]
    )
    layout = config.make_layout(SEQ)
    layout[0, -1] = 0  # a query block row with nothing to attend
    plan = BlockSparsePlan(layout, block, DEVICE)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(BATCH, HEADS, SEQ, dim, generator=g).to(DEVICE) for _ in range(3))
    return plan, q, k, v


# block 16 = one TILE; block 8 and head dim 12 exercise the bounds checks of partial tiles
SHAPES = [(16, 16), (8, 12)]


@pytest.mark.parametrize("block, dim", SHAPES)
def test_sdd(block: int, dim: int) -> None:
    plan, q, k, _ = setup(block, dim)
    close(K.sdd(q, k, plan.flat, block), R.sdd_reference(q.cpu(), k.cpu(), _cpu(plan.flat), block))


@pytest.mark.parametrize("block, dim", SHAPES)
def test_softmax_forward_with_bias(block: int, dim: int) -> None:
    plan, q, k, _ = setup(block, dim)
    scores = K.sdd(q, k, plan.flat, block)
    bias = torch.randn(BATCH, plan.nnz, block, block, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    bias[..., 0, :] = float("-inf")  # a fully masked query row inside every block
    rows = HEADS * plan.num_blocks
    expected_p, expected_lse = R.softmax_forward_reference(
        scores.cpu(), bias.cpu(), _cpu(plan.flat), 0.3, rows
    )
    lse = K.softmax_forward(scores, bias, plan.flat, 0.3, rows)
    close(scores, expected_p)
    close(lse, expected_lse)


@pytest.mark.parametrize("block, dim", SHAPES)
def test_softmax_backward(block: int, dim: int) -> None:
    plan, q, k, v = setup(block, dim)
    probs, grad = K.sdd(q, k, plan.flat, block), K.sdd(v, k, plan.flat, block)
    delta = torch.randn(BATCH, HEADS * plan.num_blocks, block).to(DEVICE)
    expected = R.softmax_backward_reference(probs.cpu(), grad.cpu(), delta.cpu(), _cpu(plan.flat))
    close(K.softmax_backward(probs, grad, delta, plan.flat), expected)


@pytest.mark.parametrize("block, dim", SHAPES)
def test_dsd_and_transposed(block: int, dim: int) -> None:
    plan, q, k, v = setup(block, dim)
    probs = K.sdd(q, k, plan.flat, block)
    flat = _cpu(plan.flat)
    close(K.dsd(probs, v, plan.flat, 0.5), R.dsd_reference(probs.cpu(), v.cpu(), flat, 0.5), atol=1e-4)
    close(
        K.dsd_transposed(probs, v, plan.flat, 2.0),
        R.dsd_transposed_reference(probs.cpu(), v.cpu(), flat, 2.0),
        atol=1e-4,
    )


@pytest.mark.parametrize(
    "config",
    [
        FixedSparsityConfig(HEADS, 16, num_local_blocks=2, attention="unidirectional"),
        BigBirdSparsityConfig(HEADS, 8, True, num_random_blocks=1),
    ],
    ids=["fixed-uni", "bigbird"],
)
def test_numba_path_matches_torch_path(config) -> None:
    """Forward and gradients (q, k, v, rpe) of the whole op, with masks, both backends."""
    g = torch.Generator().manual_seed(4)
    dim = 8
    base = [torch.randn(BATCH, HEADS, SEQ, dim, generator=g).to(DEVICE) for _ in range(3)]
    rpe0 = torch.randn(HEADS, SEQ, SEQ, generator=g).to(DEVICE)
    kp = (torch.rand(BATCH, SEQ, generator=g) > 0.2).float().to(DEVICE)
    kp[:, 0] = 1
    results = []
    for backend in ("numba", "torch"):
        module = SparseSelfAttention(
            config, key_padding_mask_mode="mul", max_seq_length=SEQ, backend=backend
        ).to(DEVICE)
        q, k, v = (t.clone().requires_grad_() for t in base)
        rpe = rpe0.clone().requires_grad_()
        out = module(q, k, v, rpe=rpe, key_padding_mask=kp)
        out.backward(torch.ones_like(out) * torch.linspace(-1, 1, SEQ, device=DEVICE)[:, None])
        results.append([out, q.grad, k.grad, v.grad, rpe.grad])
    for numba_result, torch_result in zip(*results):
        close(numba_result, torch_result, atol=1e-4)


@pytest.mark.skipif(SIMULATED, reason="half precision through the kernels is checked on a real GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_on_gpu(dtype: torch.dtype) -> None:
    config = FixedSparsityConfig(HEADS, 16, num_local_blocks=4)
    module = SparseSelfAttention(config, max_seq_length=SEQ).to(DEVICE)
    q, k, v = (
        torch.randn(BATCH, HEADS, SEQ, 32, device=DEVICE, dtype=dtype, requires_grad=True) for _ in range(3)
    )
    out = module(q, k, v)
    reference = SparseSelfAttention(config, max_seq_length=SEQ, backend="torch").to(DEVICE)(
        q.float(), k.float(), v.float()
    )
    assert out.dtype == dtype
    close(out.float(), reference, atol=2e-2)
    out.float().sum().backward()
    assert q.grad.dtype == dtype and torch.isfinite(q.grad.float()).all()


def _cpu(flat):
    return type(flat)(
        **{
            name: (value.cpu() if isinstance(value, torch.Tensor) else value)
            for name, value in vars(flat).items()
        }
    )
