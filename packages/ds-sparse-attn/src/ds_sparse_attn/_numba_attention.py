"""Autograd around the Numba CUDA kernels (see _cuda_kernels): the CUDA path of SparseSelfAttention."""

from __future__ import annotations

from typing import Any

import torch

from . import _cuda_kernels as K
from ._plan import BlockSparsePlan


class NumbaBlockSparseAttentionFunction(torch.autograd.Function):
    """softmax(scale * Q K^T + bias) V on a layout's blocks with the Numba kernels.

    q, k, v: (B, H, L, D) contiguous fp32. bias: (B' in {1, B}, nnz, bs, bs) fp32 or None; its gradient is
    dS, so a relative position bias gathered from a dense tensor gets its gradient through torch autograd.
    Saves the block probabilities (B, nnz, bs, bs) for the backward pass.
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None,
        plan: BlockSparsePlan,
        scale: float,
    ) -> torch.Tensor:
        flat = plan.flat
        probs = K.sdd(q, k, flat, plan.block)  # (B, nnz, bs, bs)
        K.softmax_forward(probs, bias, flat, scale, plan.num_heads * plan.num_blocks)
        out = K.dsd(probs, v, flat, alpha=1.0)
        ctx.save_for_backward(q, k, v, probs, out)
        ctx.plan, ctx.scale, ctx.bias_batch = plan, scale, None if bias is None else bias.shape[0]
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, probs, out = ctx.saved_tensors
        plan, scale = ctx.plan, ctx.scale
        flat = plan.flat
        grad_out = grad_out.contiguous()
        batch, heads, length, dim = q.shape
        delta = (grad_out * out).sum(-1).view(batch, heads * plan.num_blocks, plan.block)
        grad_scores = K.sdd(grad_out, v, flat, plan.block)  # dP on present blocks
        K.softmax_backward(probs, grad_scores, delta.contiguous(), flat)  # now dS (w.r.t. the softmax input)
        grad_bias = None
        if ctx.bias_batch is not None and ctx.needs_input_grad[3]:
            grad_bias = grad_scores if ctx.bias_batch == batch else grad_scores.sum(0, keepdim=True)
        grad_q = K.dsd(grad_scores, k, flat, alpha=scale)
        grad_k = K.dsd_transposed(grad_scores, q, flat, alpha=scale)
        grad_v = K.dsd_transposed(probs, grad_out, flat, alpha=1.0)
        return grad_q, grad_k, grad_v, grad_bias, None, None
