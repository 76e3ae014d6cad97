"""Index tensors that describe one layout for the block-sparse products, built once per (layout, device).

Three forms of the same layout:
* groups (CPU flash path): rows attending the same key block set stacked into one group, groups of equal
  shape batched, so each group is one head of torch's fused CPU attention kernel.
* buckets (torch path): query block rows grouped by how many key blocks they attend, each row's key blocks
  listed in a padded (rows, K) index tensor, so a bucket is processed with batched matmuls over gathered
  blocks; grouping keeps the padding waste small when a few rows (BigBird/Longformer global rows) attend far
  more blocks than the rest.
* flat (CUDA kernels): the present blocks in row-major order with CSR row pointers, and a column-major
  permutation with CSC pointers for the transposed products of the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

# Rows whose block count is at least this fraction of the bucket's widest row share the bucket, so padding
# wastes at most 1 - _BUCKET_FILL of a bucket's work.
_BUCKET_FILL = 0.75


@dataclass(frozen=True)
class Bucket:
    """Query block rows with similar block counts.

    rows: (R,) flat query block index head * nb + row.  heads, qrows: (R,) head and row of each.
    cols: (R, K) key block of each slot (padding slots repeat a valid column).  keys: (R, K) head * nb + col.
    pad_bias: (R, 1, K * block) 0 for real slots, -inf for padding; None when no row is padded.
    """

    rows: torch.Tensor
    heads: torch.Tensor
    qrows: torch.Tensor
    cols: torch.Tensor
    keys: torch.Tensor
    pad_bias: torch.Tensor | None

    @property
    def width(self) -> int:
        return self.cols.shape[1]


@dataclass(frozen=True)
class Group:
    """G groups of R query block rows each; the rows of one group attend the same K key blocks.

    rows: (G, R) flat query block index head * nb + row.  heads: (G,) head of each group.
    qrows: (G, R) query block row.  cols: (G, K) key blocks, ascending.  keys: (G, K) head * nb + col.
    """

    rows: torch.Tensor
    heads: torch.Tensor
    qrows: torch.Tensor
    cols: torch.Tensor
    keys: torch.Tensor

    @property
    def width(self) -> int:
        return self.cols.shape[1]


@dataclass(frozen=True)
class FlatLayout:
    """Present blocks in row-major order (CSR) plus a column-major view (CSC), int32 for the kernels.

    block_head, block_row, block_col: (nnz,).  row_ptr: (H * nb + 1,) into the row-major block list.
    col_ptr: (H * nb + 1,) into col_perm, which lists row-major block ids ordered by (head, col, row).
    """

    num_blocks: int
    block_head: torch.Tensor
    block_row: torch.Tensor
    block_col: torch.Tensor
    row_ptr: torch.Tensor
    col_ptr: torch.Tensor
    col_perm: torch.Tensor


class BlockSparsePlan:
    """Index tensors for a (num_heads, nb, nb) layout on one device."""

    def __init__(self, layout: torch.Tensor, block: int, device: torch.device) -> None:
        self.layout = layout.to(device=device, dtype=torch.bool)
        self.block = block
        self.num_heads, self.num_blocks = self.layout.shape[0], self.layout.shape[1]
        self.device = device

    def block_rows(self, *tensors: torch.Tensor, flat: bool = False) -> tuple[torch.Tensor, ...]:
        """(B, H, L, D) contiguous tensors as (B, H * nb, bs, D) views of their query/key block rows, or
        (B, H * nb, bs * D) with flat=True."""
        batch, dim = tensors[0].shape[0], tensors[0].shape[3]
        shape = (self.block * dim,) if flat else (self.block, dim)
        return tuple(t.view(batch, self.num_heads * self.num_blocks, *shape) for t in tensors)

    @cached_property
    def nnz(self) -> int:
        return int(self.layout.sum())

    @cached_property
    def buckets(self) -> list[Bucket]:
        flat = self.layout.reshape(-1, self.num_blocks)  # (H * nb, nb)
        counts = flat.sum(-1)
        order = torch.argsort(counts, descending=True, stable=True)
        sorted_counts = counts[order].tolist()
        buckets = []
        start = 0
        while start < len(sorted_counts) and sorted_counts[start] > 0:
            width = sorted_counts[start]
            end = start
            while end < len(sorted_counts) and sorted_counts[end] >= max(1, _BUCKET_FILL * width):
                end += 1
            buckets.append(self._bucket(flat, order[start:end], width))
            start = end
        return buckets

    def _bucket(self, flat: torch.Tensor, rows: torch.Tensor, width: int) -> Bucket:
        present = flat[rows]  # (R, nb)
        # A stable sort of "absent" puts each row's present columns first, in ascending order.
        cols = torch.argsort((~present).to(torch.int8), dim=1, stable=True)[:, :width]
        counts = present.sum(-1, keepdim=True)
        slot = torch.arange(width, device=self.device)
        valid = slot < counts  # (R, K)
        cols = torch.where(valid, cols, cols[:, :1])
        heads = rows // self.num_blocks
        pad_bias = None
        if not bool(valid.all()):
            pad = torch.zeros(valid.shape, dtype=torch.float32, device=self.device)
            pad.masked_fill_(~valid, float("-inf"))
            pad_bias = pad.repeat_interleave(self.block, dim=1).unsqueeze(1)  # (R, 1, K * block)
        return Bucket(
            rows=rows,
            heads=heads,
            qrows=rows % self.num_blocks,
            cols=cols,
            keys=heads[:, None] * self.num_blocks + cols,
            pad_bias=pad_bias,
        )

    @cached_property
    def groups(self) -> list[Group]:
        """Rows grouped by identical (head, key block set), then by group shape (R, K), exactly: no padding."""
        return _group_rows(self.layout)

    @cached_property
    def common_split(self) -> tuple[torch.Tensor, list[Group]] | None:
        """(common, rest groups): common (H, C) key blocks every query row of its head attends (a fixed
        layout's global columns), and the groups of the layout without them; None when no column is common
        to all rows (then `groups` is the whole story).

        Attending the common blocks is one large kernel call per head with no per-group re-gathering of the
        same key blocks; its result and the rest's merge through their log-sum-exps.
        """
        everyone = self.layout.all(dim=1)  # (H, nb)
        width = int(everyone.sum(-1).min())  # equal width for one batched call; the surplus goes to the rest
        if width == 0:
            return None
        common = torch.argsort((~everyone).to(torch.int8), dim=1, stable=True)[:, :width]
        taken = torch.zeros_like(everyone).scatter_(1, common, True)
        return common, _group_rows(self.layout & ~taken[:, None, :])

    @cached_property
    def flat(self) -> FlatLayout:
        head, row, col = self.layout.nonzero(as_tuple=True)  # row-major order
        nb = self.num_blocks
        row_counts = torch.bincount(head * nb + row, minlength=self.num_heads * nb)
        col_key = head * nb + col
        col_perm = torch.argsort(col_key * nb + row)
        col_counts = torch.bincount(col_key, minlength=self.num_heads * nb)
        zero = torch.zeros(1, dtype=torch.int64, device=self.device)

        def as_i32(t: torch.Tensor) -> torch.Tensor:
            return t.to(torch.int32).contiguous()

        return FlatLayout(
            num_blocks=nb,
            block_head=as_i32(head),
            block_row=as_i32(row),
            block_col=as_i32(col),
            row_ptr=as_i32(torch.cat([zero, row_counts.cumsum(0)])),
            col_ptr=as_i32(torch.cat([zero, col_counts.cumsum(0)])),
            col_perm=as_i32(col_perm),
        )


def _group_rows(layout: torch.Tensor) -> list[Group]:
    """Group the rows of an (H, nb, nb) layout by identical (head, key block set), then by shape (R, K)."""
    num_heads, nb = layout.shape[0], layout.shape[1]
    by_shape: dict[tuple[int, int], list[torch.Tensor]] = {}
    for head in range(num_heads):
        rows = layout[head]
        _, inverse, sizes = torch.unique(rows.to(torch.uint8), dim=0, return_inverse=True, return_counts=True)
        order = torch.argsort(inverse, stable=True)  # rows of each set together, ascending
        starts = (sizes.cumsum(0) - sizes).tolist()
        widths = rows[order[starts]].sum(-1).tolist()
        for start, size, width in zip(starts, sizes.tolist(), widths):
            if width > 0:  # rows attending nothing output zeros
                by_shape.setdefault((size, width), []).append(head * nb + order[start : start + size])
    flat = layout.reshape(-1, nb)
    return [
        _group(flat, torch.stack(sorted(members, key=lambda rows: int(rows[0]))), width, nb)
        for (_, width), members in by_shape.items()
    ]


def _group(flat: torch.Tensor, rows: torch.Tensor, width: int, nb: int) -> Group:
    present = flat[rows[:, 0]]  # (G, nb): the set shared by the group's rows
    cols = torch.argsort((~present).to(torch.int8), dim=1, stable=True)[:, :width]
    heads = rows[:, 0] // nb
    return Group(rows=rows, heads=heads, qrows=rows % nb, cols=cols, keys=heads[:, None] * nb + cols)
