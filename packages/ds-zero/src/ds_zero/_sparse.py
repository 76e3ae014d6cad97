"""Row-sparse reduction of embedding gradients (docs/design.md §5, ``sparse_gradients``)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._comm import AveragingRule, ProcessGroup, group_size


def _rows_and_values(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The touched row indices of a 2-D gradient and those rows.

    DeepSpeed keeps rows whose *sum* is nonzero, silently dropping a real row that sums to 0; we keep
    every row with any nonzero element instead (upstream bugs are not reproduced).
    """
    if grad.is_sparse:
        g = grad.coalesce()
        return g.indices()[0], g.values()
    rows = grad.reshape(grad.shape[0], -1).ne(0).any(dim=1).nonzero().squeeze(1)
    return rows, grad.index_select(0, rows)


def reduce_sparse_grad(
    grad: torch.Tensor | None,
    shape: torch.Size,
    dtype: torch.dtype,
    device: torch.device,
    rule: AveragingRule,
    comm_dtype: torch.dtype,
    group: ProcessGroup | None,
) -> torch.Tensor:
    """Average an embedding gradient across ranks by exchanging only the touched rows.

    Each rank all-gathers the row counts, pads its indices and rows to the largest count, all-gathers
    both, trims every contribution to its true count, and sums rows shared by several ranks with
    ``index_add_`` (a scatter-add). Returns a dense gradient, or a coalesced COO tensor when the
    input was a ``torch.sparse`` gradient.
    """
    world = group_size(group)
    if grad is None:
        rows = torch.zeros(0, dtype=torch.long, device=device)
        values = torch.zeros((0, *shape[1:]), dtype=comm_dtype, device=device)
    else:
        rows, values = _rows_and_values(grad)
        values = values.to(comm_dtype).clone()
    rule.before(values)
    count = torch.tensor([rows.numel()], dtype=torch.long, device=device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    max_count = int(max(int(c) for c in counts))
    padded_rows = torch.zeros(max_count, dtype=torch.long, device=device)
    padded_rows[: rows.numel()] = rows
    padded_values = torch.zeros((max_count, *shape[1:]), dtype=comm_dtype, device=device)
    padded_values[: rows.numel()] = values
    all_rows = [torch.empty_like(padded_rows) for _ in range(world)]
    all_values = [torch.empty_like(padded_values) for _ in range(world)]
    dist.all_gather(all_rows, padded_rows, group=group)
    dist.all_gather(all_values, padded_values, group=group)
    rows_cat = torch.cat([r[: int(c)] for r, c in zip(all_rows, counts)])
    values_cat = torch.cat([v[: int(c)] for v, c in zip(all_values, counts)])
    rule.after(values_cat)
    if grad is not None and grad.is_sparse:
        return torch.sparse_coo_tensor(rows_cat.unsqueeze(0), values_cat.to(dtype), shape).coalesce()
    dense = torch.zeros(shape, dtype=comm_dtype, device=device)
    dense.index_add_(0, rows_cat, values_cat)
    return dense.to(dtype)
