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


def masks(plan: BlockSparsePlan, block: int, bias_batch: int, seed: int = 2):
    """Additive key padding (B, L) with masked keys and a block bias (B', nnz, bs, bs) with a fully masked
    query row inside every block."""
    g = torch.Generator().manual_seed(seed)
    key_padding = torch.randn(BATCH, SEQ, generator=g)
    key_padding[:, 1] = float("-inf")
    bias = torch.randn(bias_batch, plan.nnz, block, block, generator=g)
    bias[..., 0, :] = float("-inf")
    return key_padding.to(DEVICE), bias.to(DEVICE)


# block 16 = one key tile; block 8 and head dim 12: a block smaller than a tile, a dim that is no power of two
SHAPES = [(16, 16), (8, 12)]


@pytest.mark.parametrize("block, dim", SHAPES)
@pytest.mark.parametrize("with_masks", [False, True], ids=["plain", "masked"])
def test_flash_forward(block: int, dim: int, with_masks: bool) -> None:
    plan, q, k, v = setup(block, dim)
    key_padding, bias = masks(plan, block, BATCH) if with_masks else (None, None)
    flat = _cpu(plan.flat)
    out, lse = K.flash_forward(q, k, v, key_padding, bias, plan.flat, 0.3)
    expected_out, expected_lse = R.flash_forward_reference(
        q.cpu(), k.cpu(), v.cpu(), _maybe_cpu(key_padding), _maybe_cpu(bias), flat, 0.3
    )
    close(out, expected_out, atol=1e-4)
    close(lse, expected_lse, atol=1e-4)
    assert (out.cpu()[:, 0, -block:] == 0).all(), "a query block row with no key blocks must output zeros"


@pytest.mark.parametrize("block, dim", SHAPES)
@pytest.mark.parametrize("bias_batch", [0, 1], ids=["no-bias", "shared-bias"])
def test_flash_backward(block: int, dim: int, bias_batch: int) -> None:
    plan, q, k, v = setup(block, dim)
    key_padding, bias = masks(plan, block, max(bias_batch, 1))
    if bias_batch == 0:
        bias = None
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    out, lse = K.flash_forward(q, k, v, key_padding, bias, plan.flat, 0.3)
    delta = (dout * out).sum(-1).view(BATCH, HEADS * plan.num_blocks, block).contiguous()
    dq, dk, dv, dbias = K.flash_backward(
        (q, k, v, dout, lse, delta), key_padding, bias, plan.flat, 0.3, want_dbias=bias is not None
    )
    expected = R.flash_backward_reference(
        q.cpu(), k.cpu(), v.cpu(), dout.cpu(), _maybe_cpu(key_padding), _maybe_cpu(bias), _cpu(plan.flat), 0.3
    )
    for actual, reference in zip((dq, dk, dv), expected[:3]):
        close(actual, reference, atol=1e-4)
    if bias is not None:
        close(dbias.sum(0, keepdim=True), expected[3], atol=1e-4)


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
    for backend in ("numba", "torch"):  # the Numba path with key padding (a vector) and rpe (block bias)
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


def _maybe_cpu(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.cpu()


def _cpu(flat):
    return type(flat)(
        **{
            name: (value.cpu() if isinstance(value, torch.Tensor) else value)
            for name, value in vars(flat).items()
        }
    )
