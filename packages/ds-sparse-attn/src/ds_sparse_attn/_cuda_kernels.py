"""Launchers of the flash-style Numba CUDA kernels (_numba_kernels) for block-sparse attention.

Blocks are in the flat form of _plan.FlatLayout: present block n sits at (block_head[n], block_row[n],
block_col[n]); rows are walked through CSR (row_ptr) in the forward and dQ kernels, columns through CSC
(col_ptr, col_perm) in the dK/dV kernel.

* flash_forward:       out, lse = attention over each query row's present blocks, online softmax
* flash_backward:      dq, dk, dv (and dS per present block when a bias needs its gradient), with the
                       probabilities recomputed from lse (delta = rowsum(dO * O) computed by torch)

Kernels compute in fp32. Inputs are read through `__cuda_array_interface__` (numba.cuda.as_cuda_array), so
fp32 torch tensors are used in place, with no copy, on torch's current stream. numba has no bfloat16 type:
fp16/bf16 (and fp64) inputs are converted to fp32 at the boundary and the result is cast back.
Under NUMBA_ENABLE_CUDASIM=1 the same kernels run on CPU tensors (through their numpy views) for tests.
"""

from __future__ import annotations

import os
from functools import cache
from types import SimpleNamespace
from typing import Any

import torch

from ._kernel_params import MAX_BLOCK, MAX_HEAD_DIM

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
        forward=nk.flash_forward_kernel,
        backward_dq=nk.flash_backward_dq_kernel,
        backward_dkv=nk.flash_backward_dkv_kernel,
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


def check_shapes(block: int, dim: int) -> None:
    """The kernels' limits: one thread per row of a block, per-thread row buffers of MAX_HEAD_DIM floats."""
    if dim > MAX_HEAD_DIM:
        raise ValueError(
            f"The Numba kernels take head dims up to {MAX_HEAD_DIM}, got {dim}; use backend='torch'."
        )
    if block > MAX_BLOCK:
        raise ValueError(
            f"The Numba kernels take layout blocks up to {MAX_BLOCK}, got {block}; use backend='torch'."
        )


def _optional(t: torch.Tensor | None, device: torch.device, ndim: int = 4) -> tuple[Any, bool]:
    """(array, present): an absent optional input is a 1-element placeholder of the same rank (numba types
    the kernel per rank), which the kernel never reads."""
    if t is None:
        return _array(torch.zeros((1,) * ndim, dtype=torch.float32, device=device)), False
    return _array(t), True


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding: torch.Tensor | None,
    bias: torch.Tensor | None,
    flat: Any,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out (B, H, L, D) and lse (B, H * nb, bs), fp32; q, k, v (B, H, L, D) fp32 contiguous; key_padding
    (B, L) fp32 additive; bias (B' in {1, B}, nnz, bs, bs) fp32 for the present blocks."""
    batch, heads, length, dim = q.shape
    block = length // flat.num_blocks
    check_shapes(block, dim)
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads * flat.num_blocks, block), dtype=torch.float32, device=q.device)
    kp, has_kp = _optional(key_padding, q.device, ndim=2)
    bias_arr, has_bias = _optional(bias, q.device)
    grid = (heads * flat.num_blocks, batch)
    kernels().forward[grid, block, _stream(q)](
        _array(q), _array(k), _array(v), kp, has_kp, bias_arr, has_bias,
        _array(flat.row_ptr), _array(flat.block_col), scale, _array(out), _array(lse),
    )  # fmt: skip
    return out, lse


def flash_backward(
    saved: tuple[torch.Tensor, ...],
    key_padding: torch.Tensor | None,
    bias: torch.Tensor | None,
    flat: Any,
    scale: float,
    want_dbias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """dq, dk, dv (B, H, L, D) and dS (B, nnz, bs, bs) when want_dbias; saved = (q, k, v, dout, lse, delta)."""
    q, k, v, dout, lse, delta = saved
    batch, heads, length, _ = q.shape
    block = length // flat.num_blocks
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    nnz = flat.block_head.shape[0]
    dbias = (
        torch.zeros((batch, nnz, block, block), dtype=torch.float32, device=q.device) if want_dbias else None
    )
    kp, has_kp = _optional(key_padding, q.device, ndim=2)
    bias_arr, has_bias = _optional(bias, q.device)
    dbias_arr, _ = _optional(dbias, q.device)
    grid = (heads * flat.num_blocks, batch)
    common = (_array(q), _array(k), _array(v), _array(dout), _array(lse), _array(delta), kp, has_kp)
    kernels().backward_dq[grid, block, _stream(q)](
        *common, bias_arr, has_bias, _array(flat.row_ptr), _array(flat.block_col), scale,
        _array(dq), dbias_arr, want_dbias,
    )  # fmt: skip
    kernels().backward_dkv[grid, block, _stream(q)](
        *common, bias_arr, has_bias, _array(flat.col_ptr), _array(flat.col_perm), _array(flat.block_row),
        scale, _array(dk), _array(dv),
    )  # fmt: skip
    return dq, dk, dv, dbias
