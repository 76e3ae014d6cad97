"""Plain torch versions of the Numba kernels in _cuda_kernels, same arguments and results.

Each loops over present blocks with ordinary tensor ops: slow, obviously correct, and what every kernel
test compares against.
"""

from __future__ import annotations

import math

import torch

from ._plan import FlatLayout


def _block(x: torch.Tensor, head: int, index: int, block: int) -> torch.Tensor:
    return x[:, head, index * block : (index + 1) * block]  # (B, bs, D)


def sdd_reference(a: torch.Tensor, b: torch.Tensor, flat: FlatLayout, block: int) -> torch.Tensor:
    """(B, nnz, bs, bs): a_blk @ b_blk^T for every present block."""
    blocks = [
        _block(a, h, r, block) @ _block(b, h, c, block).transpose(-1, -2)
        for h, r, c in zip(flat.block_head.tolist(), flat.block_row.tolist(), flat.block_col.tolist())
    ]
    return torch.stack(blocks, dim=1).float()


def softmax_forward_reference(
    scores: torch.Tensor, bias: torch.Tensor | None, flat: FlatLayout, scale: float, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs, lse): softmax of scale * scores + bias over each query row's present blocks."""
    batch, _, block, _ = scores.shape
    x = scores * scale + (0 if bias is None else bias)
    probs = torch.zeros_like(x)
    lse = torch.full((batch, rows, block), math.inf)
    ptr = flat.row_ptr.tolist()
    for r in range(rows):
        if ptr[r] == ptr[r + 1]:
            continue
        row = x[:, ptr[r] : ptr[r + 1]].permute(0, 2, 1, 3).reshape(batch, block, -1)  # (B, bs, n * bs)
        p = torch.softmax(row, dim=-1).nan_to_num(0.0)
        probs[:, ptr[r] : ptr[r + 1]] = p.view(batch, block, -1, block).permute(0, 2, 1, 3)
        row_lse = torch.logsumexp(row, dim=-1)
        lse[:, r] = torch.where(row_lse > -math.inf, row_lse, math.inf)
    return probs, lse


def softmax_backward_reference(
    probs: torch.Tensor, grad_probs: torch.Tensor, delta: torch.Tensor, flat: FlatLayout
) -> torch.Tensor:
    """dS = P * (dP - delta[row of block])."""
    rows = (flat.block_head.long() * flat.num_blocks + flat.block_row.long()).tolist()
    return probs * (grad_probs - delta[:, rows].unsqueeze(-1))


def dsd_reference(probs: torch.Tensor, x: torch.Tensor, flat: FlatLayout, alpha: float) -> torch.Tensor:
    """alpha * P X into (B, H, L, D), summing each row's blocks."""
    block = probs.shape[2]
    out = torch.zeros_like(x, dtype=torch.float32)
    for n, (h, r, c) in enumerate(
        zip(flat.block_head.tolist(), flat.block_row.tolist(), flat.block_col.tolist())
    ):
        out[:, h, r * block : (r + 1) * block] += probs[:, n] @ _block(x, h, c, block).float()
    return alpha * out


def dsd_transposed_reference(
    probs: torch.Tensor, x: torch.Tensor, flat: FlatLayout, alpha: float
) -> torch.Tensor:
    """alpha * P^T X into (B, H, L, D), summing each column's blocks."""
    block = probs.shape[2]
    out = torch.zeros_like(x, dtype=torch.float32)
    for n, (h, r, c) in enumerate(
        zip(flat.block_head.tolist(), flat.block_row.tolist(), flat.block_col.tolist())
    ):
        out[:, h, c * block : (c + 1) * block] += (
            probs[:, n].transpose(-1, -2) @ _block(x, h, r, block).float()
        )
    return alpha * out
