"""Block-sparse attention on CPU through torch's fused flash-attention kernel, one call per group shape.

Query block rows that attend the same set of key blocks (every row of a fixed layout's local window, for
example) form a group: their queries are stacked, the group's key/value blocks gathered once, and the group
becomes one "head" of `aten::_scaled_dot_product_flash_attention_for_cpu`. That kernel keeps the scores in
cache with an online softmax (scores never reach memory) and returns the per-row log-sum-exp, which its
backward kernel takes to recompute the probabilities, so forward and backward run at the fused kernel's FLOP
rate on exactly the layout's blocks. Groups of equal shape (rows, key blocks) go into one call, in chunks
that bound the gathered keys/values, so extra memory stays linear in sequence length.

Used for CPU tensors when no relative position bias needs a gradient (the kernel gives no gradient for its
additive mask); masks and a constant rpe are passed to the kernel as its additive mask.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ._bias import ScoreBias, gather_bias
from ._plan import BlockSparsePlan, Group

# Gathered key (and value) elements per call: 16 MB each in fp32; big enough that the per-call overhead is
# negligible, small enough that the extra memory stays a bounded chunk.
_CHUNK_KV_ELEMS = 1 << 22

# Private aten ops (the kernels behind CPU scaled_dot_product_attention, with the log-sum-exp exposed);
# a torch without them falls back to the gathered-matmul path.
_flash_forward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_flash_backward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def usable(query: torch.Tensor, rpe: torch.Tensor | None) -> bool:
    """Whether the grouped flash path applies: CPU fp32/fp64 and no rpe that needs a gradient."""
    if _flash_forward is None or _flash_backward is None:
        return False
    if query.device.type != "cpu" or query.dtype not in (torch.float32, torch.float64):
        return False
    return rpe is None or not (rpe.requires_grad and torch.is_grad_enabled())


def _chunks(group: Group, block: int, dim: int, bias: ScoreBias) -> Iterator[slice]:
    # the gathered keys, or the mask when there is one and it is larger
    per_row = dim if bias.empty else max(dim, group.qrows.shape[1] * block)
    per_group = group.width * block * per_row
    groups_per_chunk = max(1, _CHUNK_KV_ELEMS // per_group)
    for start in range(0, group.rows.shape[0], groups_per_chunk):
        yield slice(start, start + groups_per_chunk)


def _gather(x: torch.Tensor, index: torch.Tensor, block: int) -> torch.Tensor:
    """x (B, H * nb, bs * D) at block index (G, n) -> (B, G, n * bs, D), one contiguous copy."""
    out = x.index_select(1, index.reshape(-1))
    return out.view(x.shape[0], index.shape[0], index.shape[1] * block, -1)


def _mask(bias: ScoreBias, group: Group, part: slice, block: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The additive mask of a chunk of groups, (B' , G, R * bs or 1, K * bs), or None without bias."""
    if bias.empty:
        return None
    qrows = group.qrows[part, :, None]
    term = gather_bias(bias, block, group.heads[part, None, None], qrows, group.cols[part, None, :])
    # term: (B', G, R or 1, K, bs or 1, bs); key padding alone stays (B, G, 1, K, 1, bs) and the kernel
    # broadcasts it over the query rows
    if term.shape[2] * term.shape[4] > 1:
        term = torch.broadcast_to(term, (*term.shape[:2], qrows.shape[1], term.shape[3], block, block))
    batch, groups, rows, width, qrow, kcol = term.shape
    term = term.permute(0, 1, 2, 4, 3, 5).reshape(batch, groups, rows * qrow, width * kcol)
    return term.to(dtype)


def _forward_groups(
    qf: torch.Tensor,
    kf: torch.Tensor,
    vf: torch.Tensor,
    groups: list[Group],
    bias: ScoreBias,
    block: int,
    scale: float,
    empty_lse: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output (B, H * nb, bs * D) and log-sum-exp (B, H * nb, bs) over the groups' blocks; rows in no group
    get zeros and `empty_lse`."""
    batch, dim = qf.shape[0], qf.shape[2] // block
    out = torch.zeros_like(qf)
    lse = torch.full(qf.shape[:2] + (block,), empty_lse, dtype=qf.dtype)
    for group in groups:
        for part in _chunks(group, block, dim, bias):
            rows, keys = group.rows[part], group.keys[part]
            o, chunk_lse = _flash_forward(
                _gather(qf, rows, block),
                _gather(kf, keys, block),
                _gather(vf, keys, block),
                attn_mask=_mask(bias, group, part, block, qf.dtype),
                scale=scale,
            )
            flat_rows = rows.reshape(-1)
            out.index_copy_(1, flat_rows, o.reshape(batch, -1, block * dim))
            lse.index_copy_(1, flat_rows, chunk_lse.reshape(batch, -1, block))
    return out, lse


def _backward_groups(
    saved: tuple[torch.Tensor, ...],
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    groups: list[Group],
    bias: ScoreBias,
    block: int,
    scale: float,
) -> None:
    """Add the groups' contributions to the gradients grads = (dq, dk, dv), all (B, H * nb, bs * D)."""
    qf, kf, vf, out, lse, dof = saved
    dq, dk, dv = grads
    batch, dim = qf.shape[0], qf.shape[2] // block
    for group in groups:
        for part in _chunks(group, block, dim, bias):
            rows, keys = group.rows[part], group.keys[part]
            flat_rows, flat_keys = rows.reshape(-1), keys.reshape(-1)
            gq, gk, gv = _flash_backward(
                _gather(dof, rows, block),
                _gather(qf, rows, block),
                _gather(kf, keys, block),
                _gather(vf, keys, block),
                _gather(out, rows, block),
                lse.index_select(1, flat_rows).view(batch, rows.shape[0], -1),
                0.0,
                False,
                attn_mask=_mask(bias, group, part, block, qf.dtype),
                scale=scale,
            )
            dq.index_add_(1, flat_rows, gq.reshape(batch, -1, block * dim))
            dk.index_add_(1, flat_keys, gk.reshape(batch, -1, block * dim))
            dv.index_add_(1, flat_keys, gv.reshape(batch, -1, block * dim))


def _common_keys(plan: BlockSparsePlan, common: torch.Tensor) -> torch.Tensor:
    """(H, C) common key blocks -> (H * C,) flat block index head * nb + col."""
    heads = torch.arange(plan.num_heads, device=common.device)[:, None]
    return (heads * plan.num_blocks + common).reshape(-1)


class GroupedFlashAttentionFunction(torch.autograd.Function):
    """softmax(scale * Q K^T + bias) V on a layout's blocks for (B, H, L, D) contiguous CPU tensors.

    Without bias, the key blocks every row of a head attends (plan.common_split) are one kernel call per
    head over all rows, the rest per group; the two partial results merge exactly through their
    log-sum-exps. The backward pass gives each part the merged output and log-sum-exp, which makes the
    kernel's probabilities exp(s - lse) and its rowsum(dO * O) the full softmax's, so the parts' gradients
    simply add up.
    """

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
        batch, heads, length, dim = q.shape
        bs = plan.block
        qf, kf, vf = (t.reshape(batch, heads * plan.num_blocks, bs * dim) for t in (q, k, v))
        bias = ScoreBias(rpe, key_padding, attn)
        split = plan.common_split if bias.empty else None
        if split is None:
            out, lse = _forward_groups(qf, kf, vf, plan.groups, bias, bs, scale, 0.0)
        else:
            common, rest = split
            out_rest, lse_rest = _forward_groups(qf, kf, vf, rest, bias, bs, scale, float("-inf"))
            keys = _common_keys(plan, common)
            out_common, lse_common = _flash_forward(
                q,
                kf.index_select(1, keys).view(batch, heads, -1, dim),
                vf.index_select(1, keys).view(batch, heads, -1, dim),
                scale=scale,
            )
            lse_common = lse_common.reshape(lse_rest.shape)
            lse = torch.logaddexp(lse_common, lse_rest)
            # in place on the kernel's output: out = o_common * exp(lse_c - lse) + o_rest * exp(lse_r - lse)
            out = out_common.view(batch, -1, bs, dim)
            out.mul_(lse_common.sub_(lse).exp_().unsqueeze(-1))
            out.addcmul_(out_rest.view_as(out), lse_rest.sub_(lse).exp_().unsqueeze(-1))
            out = out.view_as(qf)
        ctx.save_for_backward(q, k, v, out, lse, rpe, key_padding, attn)
        ctx.plan, ctx.scale, ctx.split = plan, scale, split is not None
        return out.view(batch, heads, length, dim)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse, rpe, key_padding, attn = ctx.saved_tensors
        plan, scale = ctx.plan, ctx.scale
        batch, heads, length, dim = q.shape
        bs = plan.block
        qf, kf, vf = (t.reshape(batch, heads * plan.num_blocks, bs * dim) for t in (q, k, v))
        dof = grad_out.contiguous().view_as(out)
        bias = ScoreBias(rpe, key_padding, attn)
        dk, dv = torch.zeros_like(kf), torch.zeros_like(vf)
        groups = plan.groups
        if ctx.split:
            common, groups = plan.common_split
            keys = _common_keys(plan, common)
            dq, gk, gv = _flash_backward(
                dof.view(q.shape),
                q,
                kf.index_select(1, keys).view(batch, heads, -1, dim),
                vf.index_select(1, keys).view(batch, heads, -1, dim),
                out.view(q.shape),
                lse.view(batch, heads, length),
                0.0,
                False,
                scale=scale,
            )
            dq = dq.reshape_as(qf)
            dk.index_add_(1, keys, gk.reshape(batch, -1, bs * dim))
            dv.index_add_(1, keys, gv.reshape(batch, -1, bs * dim))
        else:
            dq = torch.zeros_like(qf)
        _backward_groups((qf, kf, vf, out, lse, dof), (dq, dk, dv), groups, bias, bs, scale)
        shape = q.shape
        return dq.view(shape), dk.view(shape), dv.view(shape), None, None, None, None, None
