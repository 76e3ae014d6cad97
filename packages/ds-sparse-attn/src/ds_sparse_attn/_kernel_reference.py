"""Plain torch versions of the Numba kernels in _cuda_kernels, same arguments and results.

Dense: the block layout and the block bias are spread onto (B, H, L, L) scores, then ordinary softmax and
matmuls. Slow, obviously correct, and what every kernel test compares against (tiny shapes only).
"""

from __future__ import annotations

import math

import torch

from ._plan import FlatLayout


def _dense_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    key_padding: torch.Tensor | None,
    bias: torch.Tensor | None,
    flat: FlatLayout,
    scale: float,
) -> torch.Tensor:
    """scale * q k^T + bias + key_padding on present blocks, -inf elsewhere: (B, H, L, L) fp32."""
    batch, heads, length, _ = q.shape
    block = length // flat.num_blocks
    scores = torch.full((batch, heads, length, length), -math.inf)
    full = q.float() @ k.float().transpose(-1, -2) * scale
    if key_padding is not None:
        full = full + key_padding[:, None, None, :]
    for n, (h, r, c) in enumerate(
        zip(flat.block_head.tolist(), flat.block_row.tolist(), flat.block_col.tolist())
    ):
        rows, cols = slice(r * block, (r + 1) * block), slice(c * block, (c + 1) * block)
        term = full[:, h, rows, cols]
        if bias is not None:
            term = term + bias[:, n]
        scores[:, h, rows, cols] = term
    return scores


def flash_forward_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding: torch.Tensor | None,
    bias: torch.Tensor | None,
    flat: FlatLayout,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) as flash_forward: out 0 and lse +inf for a row with nothing to attend."""
    batch, heads, length, _ = q.shape
    block = length // flat.num_blocks
    scores = _dense_scores(q, k, key_padding, bias, flat, scale)
    finite = (scores > -math.inf).any(-1, keepdim=True)
    # exp(s - lse) without NaN for an empty row (all -inf), in the forward and the gradients: its
    # probabilities are 0, its lse +inf
    lse = torch.logsumexp(torch.where(finite, scores, 0.0), dim=-1, keepdim=True)
    out = torch.exp(scores - torch.where(finite, lse, 0.0)) @ v.float()
    lse = torch.where(finite, lse, math.inf).squeeze(-1)
    return out, lse.reshape(batch, heads * flat.num_blocks, block)


def flash_backward_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    key_padding: torch.Tensor | None,
    bias: torch.Tensor | None,
    flat: FlatLayout,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dq, dk, dv, dbias) of flash_forward_reference's output against dout, through torch autograd; dbias
    (B', nnz, bs, bs) like bias, or None."""
    q, k, v = (t.float().detach().requires_grad_() for t in (q, k, v))
    leaves = [q, k, v]
    if bias is not None:
        bias = bias.detach().clone().requires_grad_()
        leaves.append(bias)
    out, _ = flash_forward_reference(q, k, v, key_padding, bias, flat, scale)
    grads = torch.autograd.grad(out, leaves, dout.float())
    return grads[0], grads[1], grads[2], grads[3] if bias is not None else None
