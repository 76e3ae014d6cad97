"""Block-sparse attention with batched matmuls over gathered blocks (CPU, and CUDA without Numba).

For each bucket of query block rows (see _plan), in chunks of rows: gather the row's key/value blocks with
index_select, one batched matmul for the scores (B, R, block, K * block), the softmax over the row's present
blocks, one batched matmul for the output. The backward pass is written by hand: it keeps only the output and
the per-row log-sum-exp from the forward pass and recomputes each chunk's scores, so memory is the inputs
plus one chunk, never a seq x seq matrix, and never all sparse scores at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ._bias import ScoreBias, blocked, gather_bias, scatter_rpe_grad
from ._plan import BlockSparsePlan, Bucket

# Scores per chunk (floats): small enough to stay in cache-friendly sizes and bound the extra memory
# (16 MB in fp32), large enough that per-chunk overhead does not dominate.
_CHUNK_SCORE_ELEMS = 1 << 22


def _chunks(bucket: Bucket, batch: int, block: int) -> Iterator[slice]:
    per_row = batch * block * bucket.width * block
    rows_per_chunk = max(1, _CHUNK_SCORE_ELEMS // per_row)
    for start in range(0, bucket.rows.shape[0], rows_per_chunk):
        yield slice(start, start + rows_per_chunk)


def _gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, H * nb, bs, D) at block index (R, K) -> (B, R, K * bs, D); index (R,) -> (B, R, bs, D)."""
    out = x.index_select(1, index.reshape(-1))
    if index.dim() == 2:
        return out.view(x.shape[0], index.shape[0], index.shape[1] * x.shape[2], x.shape[3])
    return out


def _scores(
    qg: torch.Tensor, kg: torch.Tensor, scale: float, bucket: Bucket, part: slice, bias: ScoreBias, block: int
) -> torch.Tensor:
    """scale * q.k + bias + padding for one chunk: (B, R, bs, K * bs)."""
    s = torch.matmul(qg * scale, kg.transpose(-1, -2))  # scaling q is D/(K*bs) of the work of scaling s
    if not bias.empty:
        cols = bucket.cols[part]
        term = gather_bias(bias, block, bucket.heads[part, None], bucket.qrows[part, None], cols)
        # (B', R, K, bs or 1, bs) -> (B', R, bs or 1, K * bs)
        term = term.permute(0, 1, 3, 2, 4).reshape(term.shape[0], cols.shape[0], term.shape[3], -1)
        s.add_(term.to(s.dtype))
    if bucket.pad_bias is not None:
        s.add_(bucket.pad_bias[part].to(s.dtype))
    return s


class BlockSparseAttentionFunction(torch.autograd.Function):
    """softmax(scale * Q K^T + bias) V on a layout's blocks, for (B, H, L, D) contiguous tensors."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rpe: torch.Tensor | None,
        key_padding: torch.Tensor | None,
        attn: torch.Tensor | None,
        plan: BlockSparsePlan,
        scale: float,
    ) -> torch.Tensor:
        batch, bs = q.shape[0], plan.block
        qf, kf, vf = plan.block_rows(q, k, v)
        bias = ScoreBias(rpe, key_padding, attn)
        out = torch.zeros_like(qf)  # rows without any block attend to nothing
        need_lse = any(ctx.needs_input_grad[:4])
        lse = torch.full(qf.shape[:3], float("inf"), dtype=q.dtype, device=q.device) if need_lse else None
        for bucket in plan.buckets:
            for part in _chunks(bucket, batch, bs):
                rows, keys = bucket.rows[part], bucket.keys[part]
                s = _scores(_gather_rows(qf, rows), _gather_rows(kf, keys), scale, bucket, part, bias, bs)
                if lse is not None:
                    chunk_lse = torch.logsumexp(s, dim=-1)
                    # +inf marks a fully masked row so that exp(s - lse) = 0 in the backward pass.
                    lse.index_copy_(1, rows, chunk_lse.masked_fill_(chunk_lse == float("-inf"), float("inf")))
                # torch's fused softmax: one pass instead of max/sub/exp/sum/div
                p = torch.softmax(s, dim=-1)
                if not bias.empty:
                    p = p.nan_to_num_(0.0)  # rows masked out entirely: 0/0 -> attend to nothing
                out.index_copy_(1, rows, torch.matmul(p, _gather_rows(vf, keys)))
        ctx.save_for_backward(q, k, v, out, lse, rpe, key_padding, attn)
        ctx.plan, ctx.scale = plan, scale
        return out.view_as(q)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse, rpe, key_padding, attn = ctx.saved_tensors
        plan, scale = ctx.plan, ctx.scale
        batch, bs = q.shape[0], plan.block
        qf, kf, vf = plan.block_rows(q, k, v)
        dof = grad_out.contiguous().view_as(out)
        delta = (dof * out).sum(-1)  # (B, H * nb, bs): rowsum(dO * O) = rowsum(P * dP)
        bias = ScoreBias(rpe, key_padding, attn)
        dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
        want_rpe = rpe is not None and ctx.needs_input_grad[3]
        drpe = None
        if want_rpe:
            drpe = torch.zeros_like(rpe, dtype=q.dtype).contiguous()
            drpe_blocked = blocked(drpe, bs)
        for bucket in plan.buckets:
            for part in _chunks(bucket, batch, bs):
                rows, keys = bucket.rows[part], bucket.keys[part]
                qg, kg, vg = _gather_rows(qf, rows), _gather_rows(kf, keys), _gather_rows(vf, keys)
                s = _scores(qg, kg, scale, bucket, part, bias, bs)
                p = s.sub_(lse.index_select(1, rows).unsqueeze(-1)).exp_()
                dog = dof.index_select(1, rows)
                dv.index_add_(1, keys.reshape(-1), _per_block(torch.matmul(p.transpose(-1, -2), dog), bs))
                ds = torch.matmul(dog, vg.transpose(-1, -2))
                ds.sub_(delta.index_select(1, rows).unsqueeze(-1)).mul_(p)  # dS = P * (dP - delta)
                if want_rpe:
                    rows_k = ds.shape[1]
                    grad = ds.view(batch, rows_k, bs, -1, bs).permute(0, 1, 3, 2, 4)
                    scatter_rpe_grad(
                        drpe_blocked,
                        grad,
                        bucket.heads[part, None],
                        bucket.qrows[part, None],
                        bucket.cols[part],
                    )
                ds.mul_(scale)
                dq.index_copy_(1, rows, torch.matmul(ds, kg))
                dk.index_add_(1, keys.reshape(-1), _per_block(torch.matmul(ds.transpose(-1, -2), qg), bs))
        return dq.view_as(q), dk.view_as(q), dv.view_as(q), drpe, None, None, None, None


def _per_block(x: torch.Tensor, block: int) -> torch.Tensor:
    """(B, R, K * bs, D) -> (B, R * K, bs, D) to scatter onto key blocks."""
    return x.reshape(x.shape[0], -1, block, x.shape[-1])
