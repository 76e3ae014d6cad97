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
    if bias.empty and _run(group.keys) is not None:  # keys read as a view: nothing gathered to bound
        yield slice(None)
        return
    # the gathered keys, or the mask when there is one and it is larger
    per_row = dim if bias.empty else max(dim, group.qrows.shape[1] * block)
    per_group = group.width * block * per_row
    groups_per_chunk = max(1, _CHUNK_KV_ELEMS // per_group)
    for start in range(0, group.rows.shape[0], groups_per_chunk):
        yield slice(start, start + groups_per_chunk)


def _run(index: torch.Tensor) -> tuple[int, int, int] | None:
    """(start, group_step, block_step) when the block index (G, n) is index[g, j] = start + g * group_step +
    j * block_step with non-negative steps (a fixed layout's windows and global columns), else None."""
    groups, width = index.shape
    start = int(index[0, 0])
    group_step = int(index[1, 0]) - start if groups > 1 else 0
    block_step = int(index[0, 1]) - start if width > 1 else 1
    if group_step < 0 or block_step < 0:
        return None
    expected = start + group_step * torch.arange(groups)[:, None] + block_step * torch.arange(width)
    return (start, group_step, block_step) if torch.equal(index, expected) else None


def _view(x: torch.Tensor, run: tuple[int, int, int], groups: int, width: int, block: int) -> torch.Tensor:
    """The blocks of a run of x (B, H * nb, bs * D), contiguous, as a (B, G, n, bs, D) view."""
    start, group_step, block_step = run
    row, dim = x.stride(1), x.shape[2] // block
    return x.as_strided(
        (x.shape[0], groups, width, block, dim),
        (x.stride(0), group_step * row, block_step * row, dim, 1),
        x.storage_offset() + start * row,
    )


def _gather(x: torch.Tensor, index: torch.Tensor, block: int) -> torch.Tensor:
    """x (B, H * nb, bs * D) at block index (G, n) -> (B, G, n * bs, D): a view when each group's blocks are
    consecutive and the groups evenly spaced, else one contiguous copy."""
    groups, width = index.shape
    run = _run(index) if x.is_contiguous() else None
    if run is not None and (run[2] == 1 or width == 1):
        return _view(x, run, groups, width, block).flatten(2, 3)
    out = x.index_select(1, index.reshape(-1))
    return out.view(x.shape[0], groups, width * block, -1)


def _add_blocks(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor, block: int) -> None:
    """dst (B, H * nb, bs * D) at block index (G, n) += src (B, G, n * bs, D), in place without copying src
    when the index is a run of distinct blocks."""
    groups, width = index.shape
    run = _run(index)
    distinct = run is not None and (groups == 1 or run[1] > (width - 1) * run[2]) and run[2] > 0
    if distinct:
        _view(dst, run, groups, width, block).add_(src.unflatten(2, (width, block)))
    else:
        dst.index_add_(1, index.reshape(-1), src.reshape(dst.shape[0], -1, dst.shape[2]))


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
    out = lse = None
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
            if rows.numel() == qf.shape[1] and _run(rows) == (0, rows.shape[1], 1):
                # one call covered every row in order: its output is the result, nothing to copy
                return o.view_as(qf), chunk_lse.reshape(batch, -1, block)
            if out is None:
                out, lse = _empty_result(qf, block, empty_lse)
            flat_rows = rows.reshape(-1)
            out.index_copy_(1, flat_rows, o.reshape(batch, -1, block * dim))
            lse.index_copy_(1, flat_rows, chunk_lse.reshape(batch, -1, block))
    return (out, lse) if out is not None else _empty_result(qf, block, empty_lse)


def _empty_result(qf: torch.Tensor, block: int, empty_lse: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros_like(qf), torch.full(qf.shape[:2] + (block,), empty_lse, dtype=qf.dtype)


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
    dim = qf.shape[2] // block
    for group in groups:
        for part in _chunks(group, block, dim, bias):
            rows, keys = group.rows[part], group.keys[part]
            gq, gk, gv = _flash_backward(
                _gather(dof, rows, block),
                _gather(qf, rows, block),
                _gather(kf, keys, block),
                _gather(vf, keys, block),
                _gather(out, rows, block),
                _gather(lse, rows, block).squeeze(-1),
                0.0,
                False,
                attn_mask=_mask(bias, group, part, block, qf.dtype),
                scale=scale,
            )
            _add_blocks(dq, rows, gq, block)
            _add_blocks(dk, keys, gk, block)
            _add_blocks(dv, keys, gv, block)


def _common_keys(plan: BlockSparsePlan, common: torch.Tensor) -> torch.Tensor:
    """(H, C) common key blocks -> (H, C) flat block index head * nb + col."""
    return torch.arange(plan.num_heads)[:, None] * plan.num_blocks + common


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
        qf, kf, vf = plan.block_rows(q, k, v, flat=True)
        bias = ScoreBias(rpe, key_padding, attn)
        split = plan.common_split if bias.empty else None
        if split is None:
            out, lse = _forward_groups(qf, kf, vf, plan.groups, bias, plan.block, scale, 0.0)
        else:
            common, rest = split
            out_rest, lse_rest = _forward_groups(qf, kf, vf, rest, bias, plan.block, scale, float("-inf"))
            keys = _common_keys(plan, common)
            out, lse_common = _flash_forward(
                q, _gather(kf, keys, plan.block), _gather(vf, keys, plan.block), scale=scale
            )  # (B, H, L, D), (B, H, L)
            lse_rest = lse_rest.view_as(lse_common)
            # exact merge: out = o_c + w (o_r - o_c) with w = exp(lse_r) / (exp(lse_c) + exp(lse_r)), the
            # rest's share of each row's softmax mass (0 for rows with no rest: lse_r = -inf)
            out.lerp_(out_rest.view_as(out), torch.sub(lse_rest, lse_common).sigmoid_().unsqueeze(-1))
            out = out.view_as(qf)
            lse = torch.logaddexp(lse_rest, lse_common)
        ctx.save_for_backward(q, k, v, out, lse, rpe, key_padding, attn)
        ctx.plan, ctx.scale, ctx.split = plan, scale, split is not None
        return out.view_as(q)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse, rpe, key_padding, attn = ctx.saved_tensors
        plan, scale = ctx.plan, ctx.scale
        qf, kf, vf = plan.block_rows(q, k, v, flat=True)
        dof = grad_out.contiguous().view_as(out)
        lse = lse.reshape(qf.shape[0], qf.shape[1], plan.block)
        dk, dv = torch.zeros_like(kf), torch.zeros_like(vf)
        groups = plan.groups
        if ctx.split:
            common, groups = plan.common_split
            keys = _common_keys(plan, common)
            dq, gk, gv = _flash_backward(
                dof.view(q.shape),
                q,
                _gather(kf, keys, plan.block),
                _gather(vf, keys, plan.block),
                out.view(q.shape),
                lse.view(q.shape[:3]),
                0.0,
                False,
                scale=scale,
            )
            dq = dq.contiguous().view_as(qf)  # the kernel returns (B, L, H, D) memory order
            _add_blocks(dk, keys, gk, plan.block)
            _add_blocks(dv, keys, gv, plan.block)
        else:
            dq = torch.zeros_like(qf)
        bias = ScoreBias(rpe, key_padding, attn)
        _backward_groups((qf, kf, vf, out, lse, dof), (dq, dk, dv), groups, bias, plan.block, scale)
        return dq.view_as(q), dk.view_as(q), dv.view_as(q), None, None, None, None, None
