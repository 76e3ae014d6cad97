"""Numba CUDA kernels for block-sparse attention, and their launchers.

Blocks are in the flat form of _plan.FlatLayout: present block n sits at (block_head[n], block_row[n],
block_col[n]); its scores are `scores[z, n, i, j]` for query i and key j inside the block.

* sdd_kernel:              scores = A B^T on present blocks only            (forward QK^T; backward dO V^T)
* softmax_forward_kernel:  probs = softmax(scale * scores + bias) over each query row's present blocks
* softmax_backward_kernel: dS = P * (dP - delta)                             (delta = rowsum(dO * O))
* dsd_kernel:              out = alpha * P X, rows of P walked by CSR        (forward PV; backward dQ)
* dsd_transposed_kernel:   out = alpha * P^T X, columns walked by CSC        (backward dK, dV)

Kernels compute in fp32. Inputs are read through `__cuda_array_interface__` (numba.cuda.as_cuda_array), so
fp32 torch tensors are used in place, with no copy, on torch's current stream. numba has no bfloat16 type:
fp16/bf16 (and fp64) inputs are converted to fp32 at the boundary and the result is cast back.
Under NUMBA_ENABLE_CUDASIM=1 the same kernels run on CPU tensors (through their numpy views) for tests.
"""

from __future__ import annotations

import math
import os
from functools import cache
from types import SimpleNamespace
from typing import Any

import torch

from ._kernel_shape import ELEMENTWISE_THREADS, ROW_THREADS, TILE

PIP_INSTALL = 'pip install "ds-sparse-attn[cuda]"  (or: pip install numba-cuda)'


def simulator_enabled() -> bool:
    """True when numba's CUDA simulator is requested (it must be set before numba is imported)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


@cache
def _cuda() -> Any:
    import numpy as np

    if not hasattr(np, "row_stack"):
        # numpy 2.5 removed this alias of vstack, which numba-cuda 0.30 still reads when it compiles a
        # kernel (seen on an H200: numba-cuda 0.30.4, numpy 2.5.2); the alias restores what it named
        np.row_stack = np.vstack
    try:
        from numba import cuda
    except ImportError as exc:
        raise ImportError(f"The CUDA kernels of ds-sparse-attn need numba-cuda: {PIP_INSTALL}") from exc
    return cuda


def numba_cuda_available() -> bool:
    """Whether the Numba kernels can run here (a GPU with numba-cuda, or the simulator)."""
    try:
        cuda = _cuda()
    except ImportError:
        return False
    return simulator_enabled() or cuda.is_available()


@cache
def kernels() -> SimpleNamespace:
    """The compiled-on-first-use kernels; numba is imported only here."""
    _cuda()
    from . import _numba_kernels as nk

    return SimpleNamespace(
        sdd=nk.sdd_kernel,
        softmax_forward=nk.softmax_forward_kernel,
        softmax_backward=nk.softmax_backward_kernel,
        dsd=nk.dsd_kernel,
        dsd_transposed=nk.dsd_transposed_kernel,
    )


def _array(t: torch.Tensor) -> Any:
    """A numba view of a torch tensor's memory (no copy). Detached: torch refuses
    ``__cuda_array_interface__`` on a tensor that requires grad, even inside an autograd Function."""
    t = t.detach()
    if t.is_cuda:
        return _cuda().as_cuda_array(t)
    if not simulator_enabled():
        raise RuntimeError(
            "The Numba kernels need CUDA tensors (CPU tensors only under NUMBA_ENABLE_CUDASIM=1)."
        )
    return t.numpy()


def _stream(t: torch.Tensor) -> Any:
    if t.is_cuda:
        return _cuda().external_stream(torch.cuda.current_stream(t.device).cuda_stream)
    return 0


def _tiles(n: int) -> int:
    return (n + TILE - 1) // TILE


def sdd(a: torch.Tensor, b: torch.Tensor, flat: Any, block: int) -> torch.Tensor:
    """(B, nnz, bs, bs) fp32 scores a_blk @ b_blk^T for the present blocks; a, b (B, H, L, D) fp32."""
    batch = a.shape[0]
    nnz = flat.block_head.shape[0]
    out = torch.empty((batch, nnz, block, block), dtype=torch.float32, device=a.device)
    if nnz:
        grid = (nnz * _tiles(block) ** 2, batch)
        args = (a, b, out, flat.block_head, flat.block_row, flat.block_col)
        kernels().sdd[grid, (TILE, TILE), _stream(a)](*map(_array, args))
    return out


def softmax_forward(
    scores: torch.Tensor, bias: torch.Tensor | None, flat: Any, scale: float, rows: int
) -> torch.Tensor:
    """In place softmax of scores (B, nnz, bs, bs); returns lse (B, rows, bs); rows = H * nb."""
    batch, _, block, _ = scores.shape
    lse = torch.full((batch, rows, block), math.inf, dtype=torch.float32, device=scores.device)
    has_bias = bias is not None
    if bias is None:
        bias = torch.zeros((1, 1, 1, 1), dtype=torch.float32, device=scores.device)
    grid = (rows * block, batch)
    args = (_array(scores), _array(bias), has_bias, _array(flat.row_ptr), scale, _array(lse))
    kernels().softmax_forward[grid, ROW_THREADS, _stream(scores)](*args)
    return lse


def softmax_backward(
    probs: torch.Tensor, grad_probs: torch.Tensor, delta: torch.Tensor, flat: Any
) -> torch.Tensor:
    """In place dS = P * (dP - delta) into grad_probs; delta (B, H * nb, bs)."""
    batch, nnz, block, _ = probs.shape
    if nnz:
        grid = ((nnz * block * block + ELEMENTWISE_THREADS - 1) // ELEMENTWISE_THREADS, batch)
        args = (probs, grad_probs, delta, flat.block_head, flat.block_row)
        kernels().softmax_backward[grid, ELEMENTWISE_THREADS, _stream(probs)](
            *map(_array, args), flat.num_blocks
        )
    return grad_probs


def dsd(probs: torch.Tensor, x: torch.Tensor, flat: Any, alpha: float) -> torch.Tensor:
    """alpha * P X: (B, H, L, D) fp32 from block probs (B, nnz, bs, bs) and x (B, H, L, D) fp32."""
    batch, heads, length, dim = x.shape
    block = probs.shape[2]
    out = torch.zeros_like(x)
    grid = (heads * (length // block) * _tiles(block) * _tiles(dim), batch)
    args = (_array(probs), _array(x), _array(out), _array(flat.row_ptr), _array(flat.block_col), alpha)
    kernels().dsd[grid, (TILE, TILE), _stream(x)](*args)
    return out


def dsd_transposed(probs: torch.Tensor, x: torch.Tensor, flat: Any, alpha: float) -> torch.Tensor:
    """alpha * P^T X: (B, H, L, D) fp32, gathered per key block through the column-major index."""
    batch, heads, length, dim = x.shape
    block = probs.shape[2]
    out = torch.zeros_like(x)
    grid = (heads * (length // block) * _tiles(block) * _tiles(dim), batch)
    args = (probs, x, out, flat.col_ptr, flat.col_perm, flat.block_row)
    kernels().dsd_transposed[grid, (TILE, TILE), _stream(x)](*map(_array, args), alpha)
    return out
