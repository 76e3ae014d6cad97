"""The Numba CUDA kernels (imported only when the CUDA path is used; numba-cuda is the `[cuda]` extra).

Kept at module level so that numba's CUDA simulator can substitute its fake `cuda` module in their globals.
Launchers, layout of the arguments and the fp32 policy are described in _cuda_kernels.
"""

import math

from numba import cuda, float32

from ._kernel_shape import ELEMENTWISE_THREADS, NEG_INF, POS_INF, ROW_THREADS, TILE

# A shared array's shape must be a compile-time constant: numba-cuda 0.30 no longer folds ``TILE + 1``
# written inside a kernel into one (seen on an H200), so the padded row length is a constant of its own.
TILE_PADDED = TILE + 1  # one spare column: a tile's column reads fall in different shared-memory banks

__all__ = [
    "dsd_kernel",
    "dsd_transposed_kernel",
    "sdd_kernel",
    "softmax_backward_kernel",
    "softmax_forward_kernel",
]


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
    sa = cuda.shared.array(shape=(TILE, TILE_PADDED), dtype=float32)
    sb = cuda.shared.array(shape=(TILE, TILE_PADDED), dtype=float32)
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
    sp = cuda.shared.array(shape=(TILE, TILE_PADDED), dtype=float32)
    sx = cuda.shared.array(shape=(TILE, TILE_PADDED), dtype=float32)
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
    sp = cuda.shared.array(shape=(TILE, TILE_PADDED), dtype=float32)
    sx = cuda.shared.array(shape=(TILE, TILE_PADDED), dtype=float32)
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
