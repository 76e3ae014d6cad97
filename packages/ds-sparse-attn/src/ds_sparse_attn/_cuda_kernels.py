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

TILE = 16  # threads per side of a 2-D thread block; block sizes need not be multiples of it
ROW_THREADS = 128  # threads cooperating on one softmax row
ELEMENTWISE_THREADS = 256
NEG_INF = -math.inf
POS_INF = math.inf

PIP_INSTALL = 'pip install "ds-sparse-attn[cuda]"  (or: pip install numba-cuda)'


def simulator_enabled() -> bool:
    """True when numba's CUDA simulator is requested (it must be set before numba is imported)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


@cache
def _cuda() -> Any:
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
    """Compile-on-first-use kernel objects (numba is imported only here)."""
    cuda = _cuda()
    from numba import float32

    @cuda.jit
    def sdd_kernel(a, b, out, block_head, block_row, block_col):
        """out[z, n] = A[z, head, row block] @ B[z, head, col block]^T for present block n.

        Grid: (nnz * tiles_per_block, batch); block: (TILE, TILE); thread (ty, tx) owns out element
        (i0 + ty, j0 + tx) of one TILE x TILE tile of the block.
        """
        bs = out.shape[2]
        tiles = (bs + TILE - 1) // TILE
        n = cuda.blockIdx.x // (tiles * tiles)
        tile = cuda.blockIdx.x % (tiles * tiles)
        z = cuda.blockIdx.y
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        i0, j0 = (tile // tiles) * TILE, (tile % tiles) * TILE
        h = block_head[n]
        a_row0 = block_row[n] * bs
        b_row0 = block_col[n] * bs
        dim = a.shape[3]
        sa = cuda.shared.array(shape=(TILE, TILE + 1), dtype=float32)
        sb = cuda.shared.array(shape=(TILE, TILE + 1), dtype=float32)
        acc = float32(0.0)
        for d0 in range(0, dim, TILE):
            d = d0 + tx
            sa[ty, tx] = a[z, h, a_row0 + i0 + ty, d] if (i0 + ty < bs and d < dim) else 0.0
            sb[ty, tx] = b[z, h, b_row0 + j0 + ty, d] if (j0 + ty < bs and d < dim) else 0.0
            cuda.syncthreads()  # both tiles loaded before any thread reads them
            for t in range(TILE):
                acc += sa[ty, t] * sb[tx, t]
            cuda.syncthreads()  # all reads done before the next iteration overwrites the tiles
        if i0 + ty < bs and j0 + tx < bs:
            out[z, n, i0 + ty, j0 + tx] = acc

    @cuda.jit
    def softmax_forward_kernel(scores, bias, has_bias, row_ptr, scale, lse):
        """In place: scores[z, n, i, :] -> softmax over the present blocks n of query row (block r, i).

        x = scale * score + bias; lse[z, r, i] = log-sum-exp of x (+inf for a row with nothing to attend,
        whose probabilities are all 0). Grid: (H * nb * bs, batch); block: (ROW_THREADS,).
        """
        bs = scores.shape[2]
        r = cuda.blockIdx.x // bs
        i = cuda.blockIdx.x % bs
        z = cuda.blockIdx.y
        zb = z if bias.shape[0] > 1 else 0
        t = cuda.threadIdx.x
        first = row_ptr[r]
        count = (row_ptr[r + 1] - first) * bs
        red = cuda.shared.array(shape=ROW_THREADS, dtype=float32)
        scale32 = float32(scale)
        local_max = float32(NEG_INF)
        for e in range(t, count, ROW_THREADS):
            n, j = first + e // bs, e % bs
            x = scores[z, n, i, j] * scale32
            if has_bias:
                x += bias[zb, n, i, j]
            scores[z, n, i, j] = x
            local_max = max(local_max, x)
        red[t] = local_max
        cuda.syncthreads()  # every partial max written before the tree reduction
        step = ROW_THREADS // 2
        while step > 0:
            if t < step:
                red[t] = max(red[t], red[t + step])
            cuda.syncthreads()  # one reduction level finished before the next reads it
            step //= 2
        row_max = red[0]
        if row_max == NEG_INF:
            row_max = float32(0.0)  # fully masked row: exp(-inf - 0) = 0 everywhere
        cuda.syncthreads()  # everyone has read red[0] before it is reused for the sum
        local_sum = float32(0.0)
        for e in range(t, count, ROW_THREADS):
            n, j = first + e // bs, e % bs
            p = math.exp(scores[z, n, i, j] - row_max)
            scores[z, n, i, j] = p
            local_sum += p
        red[t] = local_sum
        cuda.syncthreads()  # every partial sum written before the tree reduction
        step = ROW_THREADS // 2
        while step > 0:
            if t < step:
                red[t] += red[t + step]
            cuda.syncthreads()  # one reduction level finished before the next reads it
            step //= 2
        total = red[0]
        inv = float32(1.0) / total if total > 0.0 else float32(0.0)
        for e in range(t, count, ROW_THREADS):
            n, j = first + e // bs, e % bs
            scores[z, n, i, j] *= inv
        if t == 0:
            lse[z, r, i] = row_max + math.log(total) if total > 0.0 else POS_INF

    @cuda.jit
    def softmax_backward_kernel(probs, grad_probs, delta, block_head, block_row, num_blocks):
        """In place: grad_probs[z, n, i, j] = probs * (grad_probs - delta[z, head * nb + row, i]).

        Grid: (ceil(nnz * bs * bs / ELEMENTWISE_THREADS), batch); block: (ELEMENTWISE_THREADS,).
        """
        bs = probs.shape[2]
        e = cuda.blockIdx.x * ELEMENTWISE_THREADS + cuda.threadIdx.x
        z = cuda.blockIdx.y
        if e >= probs.shape[1] * bs * bs:
            return
        n = e // (bs * bs)
        i = (e // bs) % bs
        j = e % bs
        r = block_head[n] * num_blocks + block_row[n]
        grad_probs[z, n, i, j] = probs[z, n, i, j] * (grad_probs[z, n, i, j] - delta[z, r, i])

    @cuda.jit
    def dsd_kernel(probs, x, out, row_ptr, block_col, alpha):
        """out[z, h, rows of block r] = alpha * sum over row r's blocks n of probs[z, n] @ x[z, h, col block].

        Grid: (H * nb * tiles_i * tiles_d, batch); block: (TILE, TILE); thread (ty, tx) owns
        out element (i0 + ty, d0 + tx).
        """
        bs = probs.shape[2]
        dim = x.shape[3]
        num_blocks = x.shape[2] // bs
        tiles_i = (bs + TILE - 1) // TILE
        tiles_d = (dim + TILE - 1) // TILE
        r = cuda.blockIdx.x // (tiles_i * tiles_d)
        tile = cuda.blockIdx.x % (tiles_i * tiles_d)
        z = cuda.blockIdx.y
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        i0, d0 = (tile // tiles_d) * TILE, (tile % tiles_d) * TILE
        h = r // num_blocks
        sp = cuda.shared.array(shape=(TILE, TILE + 1), dtype=float32)
        sx = cuda.shared.array(shape=(TILE, TILE + 1), dtype=float32)
        acc = float32(0.0)
        for n in range(row_ptr[r], row_ptr[r + 1]):
            x_row0 = block_col[n] * bs
            for j0 in range(0, bs, TILE):
                i, j, d = i0 + ty, j0 + tx, d0 + tx
                sp[ty, tx] = probs[z, n, i, j] if (i < bs and j < bs) else 0.0
                sx[ty, tx] = x[z, h, x_row0 + j0 + ty, d] if (j0 + ty < bs and d < dim) else 0.0
                cuda.syncthreads()  # both tiles loaded before any thread reads them
                for t in range(TILE):
                    acc += sp[ty, t] * sx[t, tx]
                cuda.syncthreads()  # all reads done before the next iteration overwrites the tiles
        i, d = i0 + ty, d0 + tx
        if i < bs and d < dim:
            out[z, h, (r % num_blocks) * bs + i, d] = alpha * acc

    @cuda.jit
    def dsd_transposed_kernel(probs, x, out, col_ptr, col_perm, block_row, alpha):
        """out[z, h, rows of block c] = alpha * sum over column c's blocks n of probs[z, n]^T @ x[z, h, row block].

        Grid: (H * nb * tiles_j * tiles_d, batch); block: (TILE, TILE); thread (ty, tx) owns
        out element (j0 + ty, d0 + tx).
        """
        bs = probs.shape[2]
        dim = x.shape[3]
        num_blocks = x.shape[2] // bs
        tiles_j = (bs + TILE - 1) // TILE
        tiles_d = (dim + TILE - 1) // TILE
        c = cuda.blockIdx.x // (tiles_j * tiles_d)
        tile = cuda.blockIdx.x % (tiles_j * tiles_d)
        z = cuda.blockIdx.y
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        j0, d0 = (tile // tiles_d) * TILE, (tile % tiles_d) * TILE
        h = c // num_blocks
        sp = cuda.shared.array(shape=(TILE, TILE + 1), dtype=float32)
        sx = cuda.shared.array(shape=(TILE, TILE + 1), dtype=float32)
        acc = float32(0.0)
        for e in range(col_ptr[c], col_ptr[c + 1]):
            n = col_perm[e]
            x_row0 = block_row[n] * bs
            for i0 in range(0, bs, TILE):
                j, i, d = j0 + ty, i0 + tx, d0 + tx
                sp[ty, tx] = probs[z, n, i, j] if (i < bs and j < bs) else 0.0  # sp[j, i] = P^T
                sx[ty, tx] = x[z, h, x_row0 + i0 + ty, d] if (i0 + ty < bs and d < dim) else 0.0
                cuda.syncthreads()  # both tiles loaded before any thread reads them
                for t in range(TILE):
                    acc += sp[ty, t] * sx[t, tx]
                cuda.syncthreads()  # all reads done before the next iteration overwrites the tiles
        j, d = j0 + ty, d0 + tx
        if j < bs and d < dim:
            out[z, h, (c % num_blocks) * bs + j, d] = alpha * acc

    return SimpleNamespace(
        sdd=sdd_kernel,
        softmax_forward=softmax_forward_kernel,
        softmax_backward=softmax_backward_kernel,
        dsd=dsd_kernel,
        dsd_transposed=dsd_transposed_kernel,
    )


def _array(t: torch.Tensor) -> Any:
    """A numba view of a torch tensor's memory (no copy)."""
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
