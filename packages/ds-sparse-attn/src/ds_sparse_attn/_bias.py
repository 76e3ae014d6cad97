"""Additive score terms (relative position bias and masks) gathered for present blocks only."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ScoreBias:
    """What is added to `scale * q.k` before the softmax; each part may be None.

    rpe: (B' in {1, B}, H' in {1, H}, L, L), differentiable.  key_padding: (B, L) additive.
    attn: (L, L) additive.  Dense inputs, as the user supplies them; only present blocks are read.
    """

    rpe: torch.Tensor | None = None
    key_padding: torch.Tensor | None = None
    attn: torch.Tensor | None = None

    @property
    def empty(self) -> bool:
        return self.rpe is None and self.key_padding is None and self.attn is None


def blocked(square: torch.Tensor, block: int) -> torch.Tensor:
    """View (..., L, L) as (..., nb, nb, block, block) without copying."""
    *lead, length, _ = square.shape
    nb = length // block
    view = square.reshape(*lead, nb, block, nb, block)
    n = len(lead)
    return view.permute(*range(n), n, n + 2, n + 1, n + 3)


def gather_bias(
    bias: ScoreBias, block: int, heads: torch.Tensor, qrows: torch.Tensor, cols: torch.Tensor
) -> torch.Tensor | None:
    """The bias of blocks (heads, qrows, cols), index tensors broadcast to shape S: (B or 1, *S, block, block)."""
    total = None
    if bias.rpe is not None:
        rpe = blocked(bias.rpe, block)  # (B', H', nb, nb, bs, bs)
        head_index = heads if bias.rpe.shape[1] > 1 else torch.zeros_like(heads)
        total = rpe[:, head_index, qrows, cols]
    if bias.attn is not None:
        term = blocked(bias.attn, block)[qrows, cols].unsqueeze(0)
        total = term if total is None else total + term
    if bias.key_padding is not None:
        batch = bias.key_padding.shape[0]
        kp = bias.key_padding.reshape(batch, -1, block)[:, cols]  # (B, *S, bs)
        term = kp.unsqueeze(-2)
        total = term if total is None else total + term
    return total


def scatter_rpe_grad(
    grad_rpe_blocked: torch.Tensor,
    grad: torch.Tensor,
    heads: torch.Tensor,
    qrows: torch.Tensor,
    cols: torch.Tensor,
) -> None:
    """Accumulate `grad` (B, *S, bs, bs) into (B', H', nb, nb, bs, bs) at (heads, qrows, cols)."""
    if grad_rpe_blocked.shape[0] == 1:
        grad = grad.sum(0, keepdim=True)
    if grad_rpe_blocked.shape[1] == 1:
        heads = torch.zeros_like(heads)
    batch = torch.arange(grad_rpe_blocked.shape[0], device=grad.device)
    batch = batch.view(-1, *([1] * heads.dim()))
    grad_rpe_blocked.index_put_((batch, heads, qrows, cols), grad.to(grad_rpe_blocked.dtype), accumulate=True)
