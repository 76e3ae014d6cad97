"""Dense attention with the layout as a mask: the reference the block-sparse paths must match."""

from __future__ import annotations

import torch


def dense_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: torch.Tensor,
    block: int,
    rpe: torch.Tensor | None = None,
    key_padding: torch.Tensor | None = None,
    attn: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + rpe + key_padding + attn, masked to the layout) v; masks additive."""
    seq_len = q.shape[2]
    nb = seq_len // block
    layout = layout[:, :nb, :nb]
    allowed = layout.bool().repeat_interleave(block, 1).repeat_interleave(block, 2)  # (H, L, L)
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if rpe is not None:
        scores = scores + rpe
    if key_padding is not None:
        scores = scores + key_padding[:, None, None, :]
    if attn is not None:
        scores = scores + attn
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
