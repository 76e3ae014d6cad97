"""Flash-style Numba CUDA kernels for block-sparse attention (numba-cuda is the `[cuda]` extra).

One CUDA thread block per (query or key block row, batch); one thread per row of that block. A pass over the
layout's present blocks stages KEY_TILE rows of the other side in shared memory at a time; scores live in
registers only: nothing of size nnz x block^2 is written, except dS for an rpe that asks for its gradient.

* flash_forward_kernel: per query row, an online softmax over the row's present key blocks (CSR): out, and
  lse = log-sum-exp (+inf for a row with nothing to attend, whose output is 0).
* flash_backward_dq_kernel: per query row, P recomputed from lse, dS = P * (dO.V - delta), dQ = scale * dS K.
* flash_backward_dkv_kernel: per key row, over the key block's present query blocks (CSC): dV = P^T dO,
  dK = scale * dS^T Q.

Scores are scale * q.k + bias[b', n, i, j] (rpe and attention mask of present block n, optional) +
key_padding[b, key] (optional). Everything is fp32. Kept at module level so that numba's CUDA simulator
can substitute its fake `cuda` module in their globals.
"""

import math

from numba import cuda, float32

from ._kernel_params import KEY_TILE, MAX_HEAD_DIM

NEG_INF = -math.inf
POS_INF = math.inf

__all__ = ["flash_backward_dkv_kernel", "flash_backward_dq_kernel", "flash_forward_kernel"]


@cuda.jit
def flash_forward_kernel(q, k, v, key_padding, has_kp, bias, has_bias, row_ptr, block_col, scale, out, lse):
    """Grid (H * nb, batch), block (bs,). q, k, v, out: (B, H, L, D); lse: (B, H * nb, bs)."""
    bs = cuda.blockDim.x
    r, z, i = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    dim = q.shape[3]
    num_blocks = q.shape[2] // bs
    h, row = r // num_blocks, (r % num_blocks) * bs + i
    zb = z if bias.shape[0] > 1 else 0
    sk = cuda.shared.array(shape=(KEY_TILE, MAX_HEAD_DIM), dtype=float32)
    sv = cuda.shared.array(shape=(KEY_TILE, MAX_HEAD_DIM), dtype=float32)
    qi = cuda.local.array(MAX_HEAD_DIM, float32)
    acc = cuda.local.array(MAX_HEAD_DIM, float32)
    scale32 = float32(scale)
    for d in range(dim):
        qi[d] = q[z, h, row, d] * scale32
        acc[d] = 0.0
    m = float32(NEG_INF)
    total = float32(0.0)
    for n in range(row_ptr[r], row_ptr[r + 1]):
        col0 = block_col[n] * bs
        for j0 in range(0, bs, KEY_TILE):
            for e in range(i, KEY_TILE * dim, bs):
                jj, d = e // dim, e % dim
                if j0 + jj < bs:
                    sk[jj, d] = k[z, h, col0 + j0 + jj, d]
                    sv[jj, d] = v[z, h, col0 + j0 + jj, d]
            cuda.syncthreads()  # the key/value tile is staged before any thread reads it
            for jj in range(min(KEY_TILE, bs - j0)):
                s = float32(0.0)
                for d in range(dim):
                    s += qi[d] * sk[jj, d]
                if has_bias:
                    s += bias[zb, n, i, j0 + jj]
                if has_kp:
                    s += key_padding[z, col0 + j0 + jj]
                if s == NEG_INF:
                    continue  # masked key: no weight (and no exp(-inf - -inf))
                if s > m:  # a new row maximum: rescale what was summed so far
                    correction = math.exp(m - s)
                    total *= correction
                    for d in range(dim):
                        acc[d] *= correction
                    m = s
                p = math.exp(s - m)
                total += p
                for d in range(dim):
                    acc[d] += p * sv[jj, d]
            cuda.syncthreads()  # every thread is done with the tile before the next one is staged
    inv = float32(1.0) / total if total > 0.0 else float32(0.0)
    for d in range(dim):
        out[z, h, row, d] = acc[d] * inv
    lse[z, r, i] = m + math.log(total) if total > 0.0 else POS_INF


@cuda.jit
def flash_backward_dq_kernel(
    q,
    k,
    v,
    dout,
    lse,
    delta,
    key_padding,
    has_kp,
    bias,
    has_bias,
    row_ptr,
    block_col,
    scale,
    dq,
    dbias,
    want_dbias,
):
    """Grid (H * nb, batch), block (bs,). dq: (B, H, L, D); dbias (B, nnz, bs, bs) written when want_dbias."""
    bs = cuda.blockDim.x
    r, z, i = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    dim = q.shape[3]
    num_blocks = q.shape[2] // bs
    h, row = r // num_blocks, (r % num_blocks) * bs + i
    zb = z if bias.shape[0] > 1 else 0
    sk = cuda.shared.array(shape=(KEY_TILE, MAX_HEAD_DIM), dtype=float32)
    sv = cuda.shared.array(shape=(KEY_TILE, MAX_HEAD_DIM), dtype=float32)
    qi = cuda.local.array(MAX_HEAD_DIM, float32)
    doi = cuda.local.array(MAX_HEAD_DIM, float32)
    acc = cuda.local.array(MAX_HEAD_DIM, float32)
    scale32 = float32(scale)
    for d in range(dim):
        qi[d] = q[z, h, row, d] * scale32
        doi[d] = dout[z, h, row, d]
        acc[d] = 0.0
    row_lse = lse[z, r, i]
    row_delta = delta[z, r, i]
    for n in range(row_ptr[r], row_ptr[r + 1]):
        col0 = block_col[n] * bs
        for j0 in range(0, bs, KEY_TILE):
            for e in range(i, KEY_TILE * dim, bs):
                jj, d = e // dim, e % dim
                if j0 + jj < bs:
                    sk[jj, d] = k[z, h, col0 + j0 + jj, d]
                    sv[jj, d] = v[z, h, col0 + j0 + jj, d]
            cuda.syncthreads()  # the key/value tile is staged before any thread reads it
            for jj in range(min(KEY_TILE, bs - j0)):
                s = float32(0.0)
                dp = float32(0.0)
                for d in range(dim):
                    s += qi[d] * sk[jj, d]
                    dp += doi[d] * sv[jj, d]
                if has_bias:
                    s += bias[zb, n, i, j0 + jj]
                if has_kp:
                    s += key_padding[z, col0 + j0 + jj]
                p = math.exp(s - row_lse)  # 0 for a masked key, and for every key of an empty row (lse +inf)
                ds = p * (dp - row_delta)
                if want_dbias:
                    dbias[z, n, i, j0 + jj] = ds
                for d in range(dim):
                    acc[d] += ds * sk[jj, d]
            cuda.syncthreads()  # every thread is done with the tile before the next one is staged
    for d in range(dim):
        dq[z, h, row, d] = acc[d] * scale32


@cuda.jit
def flash_backward_dkv_kernel(
    q,
    k,
    v,
    dout,
    lse,
    delta,
    key_padding,
    has_kp,
    bias,
    has_bias,
    col_ptr,
    col_perm,
    block_row,
    scale,
    dk,
    dv,
):
    """Grid (H * nb, batch), block (bs,): thread j owns key row j of key block c. dk, dv: (B, H, L, D)."""
    bs = cuda.blockDim.x
    c, z, j = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    dim = q.shape[3]
    num_blocks = q.shape[2] // bs
    h, key = c // num_blocks, (c % num_blocks) * bs + j
    zb = z if bias.shape[0] > 1 else 0
    sq = cuda.shared.array(shape=(KEY_TILE, MAX_HEAD_DIM), dtype=float32)
    sdo = cuda.shared.array(shape=(KEY_TILE, MAX_HEAD_DIM), dtype=float32)
    slse = cuda.shared.array(shape=KEY_TILE, dtype=float32)
    sdelta = cuda.shared.array(shape=KEY_TILE, dtype=float32)
    kj = cuda.local.array(MAX_HEAD_DIM, float32)
    vj = cuda.local.array(MAX_HEAD_DIM, float32)
    dk_acc = cuda.local.array(MAX_HEAD_DIM, float32)
    dv_acc = cuda.local.array(MAX_HEAD_DIM, float32)
    scale32 = float32(scale)
    for d in range(dim):
        kj[d] = k[z, h, key, d] * scale32
        vj[d] = v[z, h, key, d]
        dk_acc[d] = 0.0
        dv_acc[d] = 0.0
    kp = key_padding[z, key] if has_kp else float32(0.0)
    for e in range(col_ptr[c], col_ptr[c + 1]):
        n = col_perm[e]
        rb = h * num_blocks + block_row[n]
        row0 = block_row[n] * bs
        for i0 in range(0, bs, KEY_TILE):
            for t in range(j, KEY_TILE * dim, bs):
                ii, d = t // dim, t % dim
                if i0 + ii < bs:
                    sq[ii, d] = q[z, h, row0 + i0 + ii, d]
                    sdo[ii, d] = dout[z, h, row0 + i0 + ii, d]
            if j < KEY_TILE and i0 + j < bs:
                slse[j] = lse[z, rb, i0 + j]
                sdelta[j] = delta[z, rb, i0 + j]
            cuda.syncthreads()  # the query/dO tile is staged before any thread reads it
            for ii in range(min(KEY_TILE, bs - i0)):
                s = float32(0.0)
                dp = float32(0.0)
                for d in range(dim):
                    s += sq[ii, d] * kj[d]
                    dp += sdo[ii, d] * vj[d]
                s += kp
                if has_bias:
                    s += bias[zb, n, i0 + ii, j]
                p = math.exp(s - slse[ii])
                ds = p * (dp - sdelta[ii])
                for d in range(dim):
                    dv_acc[d] += p * sdo[ii, d]
                    dk_acc[d] += ds * sq[ii, d]
            cuda.syncthreads()  # every thread is done with the tile before the next one is staged
    for d in range(dim):
        dk[z, h, key, d] = dk_acc[d] * scale32
        dv[z, h, key, d] = dv_acc[d]
