"""Autograd around the flash-style Numba CUDA kernels (see _cuda_kernels): the portable CUDA path."""

from __future__ import annotations

from typing import Any

import torch

from . import _cuda_kernels as K
from ._bias import ScoreBias, gather_bias
from ._plan import BlockSparsePlan


class NumbaFlashAttentionFunction(torch.autograd.Function):
    """softmax(scale * Q K^T + bias) V on a layout's blocks with the Numba kernels.

    q, k, v: (B, H, L, D) contiguous fp32. key_padding: (B, L) fp32 additive or None. bias: (B' in {1, B},
    nnz, bs, bs) fp32 (rpe and attention mask of the present blocks) or None; its gradient is dS, so an rpe
    gathered from a dense tensor gets its gradient through torch autograd. Saves the output and the per-row
    log-sum-exp (O(sequence)), not the probabilities: the backward kernels recompute them.
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_padding: torch.Tensor | None,
        bias: torch.Tensor | None,
        plan: BlockSparsePlan,
        scale: float,
    ) -> torch.Tensor:
        out, lse = K.flash_forward(q, k, v, key_padding, bias, plan.flat, scale)
        ctx.save_for_backward(q, k, v, out, lse, key_padding, bias)
        ctx.plan, ctx.scale = plan, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse, key_padding, bias = ctx.saved_tensors
        plan = ctx.plan
        grad_out = grad_out.float().contiguous()
        batch = q.shape[0]
        delta = (grad_out * out).sum(-1).view(batch, plan.num_heads * plan.num_blocks, plan.block)
        want_dbias = bias is not None and ctx.needs_input_grad[4]
        saved = (q, k, v, grad_out, lse, delta.contiguous())
        dq, dk, dv, dbias = K.flash_backward(saved, key_padding, bias, plan.flat, ctx.scale, want_dbias)
        if dbias is not None and bias.shape[0] == 1 and batch > 1:
            dbias = dbias.sum(0, keepdim=True)
        return dq, dk, dv, None, dbias, None, None


def numba_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: ScoreBias, plan: BlockSparsePlan, scale: float
) -> torch.Tensor:
    """The Numba path for fp32 contiguous (B, H, L, D) inputs: key padding goes to the kernels as a (B, L)
    vector; an rpe or attention mask as the bias of the present blocks (nnz x block^2 floats, gathered from
    the dense (L, L) input; without them nothing of that size exists)."""
    key_padding = None if bias.key_padding is None else bias.key_padding.float().contiguous()
    block_bias = None
    if bias.rpe is not None or bias.attn is not None:
        flat = plan.flat
        index = (flat.block_head.long(), flat.block_row.long(), flat.block_col.long())
        term = gather_bias(ScoreBias(bias.rpe, None, bias.attn), plan.block, *index)
        block_bias = term.expand(term.shape[0], -1, plan.block, plan.block).float().contiguous()
    return NumbaFlashAttentionFunction.apply(q, k, v, key_padding, block_bias, plan, scale)
