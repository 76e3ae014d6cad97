"""Block-sparsity layouts: which (query block, key block) pairs each head computes.

A layout is an int64 tensor of shape (num_heads, nb, nb) with nb = seq_len // block; row = query block,
column = key block. The rules reproduce DeepSpeed 0.14 (`deepspeed.ops.sparse_attention.sparsity_config`)
exactly for the same random draws. Randomness comes from a seedable `torch.Generator` (DeepSpeed used the
unseeded global `random` module) and is broadcast from rank 0 when torch.distributed is initialised, so every
rank and every rerun agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

_DIRECTIONS = ("unidirectional", "bidirectional")


def _check_attention(attention: str) -> None:
    if attention not in _DIRECTIONS:
        raise NotImplementedError(
            f'only "uni/bi-directional" attentions are supported for now! Got attention={attention!r}; '
            "use 'unidirectional' or 'bidirectional'."
        )


def _check_horizontal(attention: str, horizontal_global_attention: bool) -> None:
    if horizontal_global_attention and attention != "bidirectional":
        raise ValueError(
            'only "bi-directional" attentions can support horizontal global attention! '
            "Set attention='bidirectional' or horizontal_global_attention=False."
        )


def _check_global_ranges(starts: Sequence[int], ends: Sequence[int] | None) -> None:
    if ends is None:
        return
    if len(starts) != len(ends):
        raise ValueError(
            f"Global block start indices length, {len(starts)}, must be same as global block end indices "
            f"length, {len(ends)}!"
        )
    for start, end in zip(starts, ends):
        if start >= end:
            raise ValueError(
                f"Global block start index, {start}, must be smaller than global block end index, {end}!"
            )


def _check_fits(what: str, count: int, num_blocks: int) -> None:
    if num_blocks < count:
        raise ValueError(
            f"Number of {what}, {count}, must be smaller than overall number of blocks in a row, "
            f"{num_blocks}! Use a longer sequence or fewer {what}."
        )


def _sample_columns(population: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """`count` distinct column indices drawn uniformly from range(population)."""
    return torch.randperm(population, generator=generator)[:count]


def _broadcast_from_rank0(layout: torch.Tensor) -> torch.Tensor:
    """Make every rank hold rank 0's layout (a no-op when torch.distributed is not initialised)."""
    if not (dist.is_available() and dist.is_initialized()):
        return layout
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    buffer = layout.to(device)
    dist.broadcast(buffer, src=0)
    return buffer.to(layout.device)


def _sliding_window(layout: torch.Tensor, h: int, num_sliding_window_blocks: int, causal: bool) -> None:
    num_blocks = layout.shape[1]
    half = num_sliding_window_blocks // 2
    for row in range(num_blocks):
        end = row + 1 if causal else min(row + half + 1, num_blocks)
        layout[h, row, max(0, row - half) : end] = 1


class SparsityConfig:
    """Base of every layout: the number of heads, the block size and whether heads differ.

    Args:
        num_heads: attention heads of the layer the layout is for.
        block: block size in tokens; the sequence length must be a multiple of it.
        different_layout_per_head: give each head its own layout (only Fixed global patterns and
            random blocks make heads differ); otherwise head 0's layout is copied to every head.
    """

    def __init__(self, num_heads: int, block: int = 16, different_layout_per_head: bool = False) -> None:
        if num_heads < 1:
            raise ValueError(f"num_heads must be at least 1, got {num_heads}.")
        if block < 1:
            raise ValueError(f"block must be a positive number of tokens, got {block}.")
        self.num_heads = num_heads
        self.block = block
        self.different_layout_per_head = different_layout_per_head
        self.num_layout_heads = num_heads if different_layout_per_head else 1

    def setup_layout(self, seq_len: int) -> torch.Tensor:
        """An all-zero (num_heads, nb, nb) int64 layout; raises if seq_len is not a multiple of block."""
        if seq_len % self.block != 0:
            raise ValueError(
                f"Sequence Length, {seq_len}, needs to be dividable by Block size {self.block}! "
                "Pad the inputs with SparseAttentionUtils.pad_to_block_size."
            )
        num_blocks = seq_len // self.block
        return torch.zeros((self.num_heads, num_blocks, num_blocks), dtype=torch.int64)

    def check_and_propagate_first_head_layout(self, layout: torch.Tensor) -> torch.Tensor:
        """Copy head 0 to every head unless each head has its own layout."""
        if not self.different_layout_per_head:
            layout[1:] = layout[0]
        return layout

    def make_layout(self, seq_len: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """The (num_heads, seq_len // block, seq_len // block) layout. Subclasses implement it."""
        raise NotImplementedError(
            f"{type(self).__name__} has no layout of its own; use DenseSparsityConfig, FixedSparsityConfig, "
            "VariableSparsityConfig, BigBirdSparsityConfig, BSLongformerSparsityConfig or "
            "LocalSlidingWindowSparsityConfig."
        )


class _RandomLayoutMixin:
    """Seedable randomness shared by the layouts that draw random blocks."""

    seed: int

    def _generator(self, generator: torch.Generator | None) -> torch.Generator:
        if generator is not None:
            return generator
        return torch.Generator().manual_seed(self.seed)


class DenseSparsityConfig(SparsityConfig):
    """Every block present: dense attention expressed as a layout (useful as a baseline)."""

    def make_layout(self, seq_len: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """All ones."""
        layout = self.setup_layout(seq_len)
        layout[:] = 1
        return layout


class FixedSparsityConfig(SparsityConfig):
    """Local windows plus per-window global blocks (Child et al., "Generating Long Sequences ...").

    Args:
        num_local_blocks: blocks per local window; a window attends to itself (fully, or causally).
        num_global_blocks: consecutive blocks of each window that every row attends to.
        attention: 'bidirectional' or 'unidirectional' (causal inside windows, global columns seen only
            from their own row onwards).
        horizontal_global_attention: global blocks also attend to every block (bidirectional only).
        num_different_global_patterns: with different_layout_per_head, head h uses the global blocks
            counted (1 + h % P) * G from the end of each window.
    """

    def __init__(
        self,
        num_heads: int,
        block: int = 16,
        different_layout_per_head: bool = False,
        num_local_blocks: int = 4,
        num_global_blocks: int = 1,
        attention: str = "bidirectional",
        horizontal_global_attention: bool = False,
        num_different_global_patterns: int = 1,
    ) -> None:
        super().__init__(num_heads, block, different_layout_per_head)
        if num_global_blocks < 1 or num_local_blocks % num_global_blocks != 0:
            raise ValueError(
                f"Number of blocks in a local window, {num_local_blocks}, must be dividable by number of "
                f"global blocks, {num_global_blocks}!"
            )
        _check_attention(attention)
        _check_horizontal(attention, horizontal_global_attention)
        if num_different_global_patterns > 1 and not different_layout_per_head:
            raise ValueError(
                "Number of different layouts cannot be more than one when you have set a single layout for "
                "all heads! Set different_layout_per_head to True."
            )
        max_patterns = num_local_blocks // num_global_blocks
        if num_different_global_patterns > max_patterns:
            raise ValueError(
                f"Number of layout versions (num_different_global_patterns), {num_different_global_patterns}, "
                f"cannot be larger than number of local window blocks divided by number of global blocks, "
                f"{num_local_blocks} / {num_global_blocks} = {max_patterns}!"
            )
        self.num_local_blocks = num_local_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention
        self.horizontal_global_attention = horizontal_global_attention
        self.num_different_global_patterns = num_different_global_patterns

    def set_local_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """Windows [i, i + num_local_blocks), the last one truncated; causal inside when unidirectional."""
        num_blocks = layout.shape[1]
        causal = self.attention == "unidirectional"
        for start in range(0, num_blocks, self.num_local_blocks):
            end = min(start + self.num_local_blocks, num_blocks)
            for row in range(start, end):
                layout[h, row, start : (row + 1 if causal else end)] = 1
        return layout

    def _set_global_columns(self, h: int, layout: torch.Tensor, start: int, end: int) -> None:
        first_row = 0 if self.attention == "bidirectional" else start
        layout[h, first_row:, start:end] = 1
        if self.horizontal_global_attention:
            layout[h, start:end, :] = 1

    def set_global_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """Global column groups of each full window, and of a short last window if there is one."""
        num_blocks = layout.shape[1]
        pattern = h % self.num_different_global_patterns
        first_global = self.num_local_blocks - (1 + pattern) * self.num_global_blocks
        full_windows_end = num_blocks - num_blocks % self.num_local_blocks
        for start in range(first_global, full_windows_end, self.num_local_blocks):
            self._set_global_columns(h, layout, start, start + self.num_global_blocks)
        if full_windows_end < num_blocks:
            # A short last window still gets G global blocks, clipped to end at the last block.
            start = min(full_windows_end + first_global, num_blocks - self.num_global_blocks)
            self._set_global_columns(h, layout, start, start + self.num_global_blocks)
        return layout

    def make_layout(self, seq_len: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Local windows, then global blocks, per layout head."""
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_local_layout(h, layout)
            self.set_global_layout(h, layout)
        return self.check_and_propagate_first_head_layout(layout)


class VariableSparsityConfig(_RandomLayoutMixin, SparsityConfig):
    """Random blocks, local windows of listed sizes, and global blocks at given indices or ranges.

    Args:
        num_random_blocks: random key blocks per row (drawn over all blocks, whatever the direction).
        local_window_blocks: sizes of the first windows; the last size repeats for the rest.
        global_block_indices: global blocks (or range starts when global_block_end_indices is given).
        global_block_end_indices: exclusive range ends, same length as global_block_indices.
        attention: 'bidirectional' or 'unidirectional'.
        horizontal_global_attention: global blocks also attend to every block (bidirectional only).
        seed: seeds the random blocks when make_layout gets no generator.
    """

    def __init__(
        self,
        num_heads: int,
        block: int = 16,
        different_layout_per_head: bool = False,
        num_random_blocks: int = 0,
        local_window_blocks: Sequence[int] = (4,),
        global_block_indices: Sequence[int] = (0,),
        global_block_end_indices: Sequence[int] | None = None,
        attention: str = "bidirectional",
        horizontal_global_attention: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(num_heads, block, different_layout_per_head)
        local_window_blocks = list(local_window_blocks)
        if not local_window_blocks or any(size < 1 for size in local_window_blocks):
            raise ValueError(
                f"local_window_blocks must list at least one positive window size, got {local_window_blocks}."
            )
        global_block_indices = list(global_block_indices)
        if global_block_end_indices is not None:
            global_block_end_indices = list(global_block_end_indices)
        _check_global_ranges(global_block_indices, global_block_end_indices)
        _check_attention(attention)
        _check_horizontal(attention, horizontal_global_attention)
        self.num_random_blocks = num_random_blocks
        self.local_window_blocks = local_window_blocks
        self.global_block_indices = global_block_indices
        self.global_block_end_indices = global_block_end_indices
        self.attention = attention
        self.horizontal_global_attention = horizontal_global_attention
        self.seed = seed

    def set_random_layout(self, h: int, layout: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """num_random_blocks distinct random columns in every row."""
        num_blocks = layout.shape[1]
        _check_fits("random blocks", self.num_random_blocks, num_blocks)
        for row in range(num_blocks):
            layout[h, row, _sample_columns(num_blocks, self.num_random_blocks, generator)] = 1
        return layout

    def set_local_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """Consecutive windows of the listed sizes; the last size repeats to the end."""
        num_blocks = layout.shape[1]
        causal = self.attention == "unidirectional"
        windows = []
        start = 0
        for size in self.local_window_blocks:
            windows.append((start, min(start + size, num_blocks)))
            start += size
        size = self.local_window_blocks[-1]
        windows += [(i, min(i + size, num_blocks)) for i in range(start, num_blocks, size)]
        for start, end in windows:
            for row in range(start, end):
                layout[h, row, start : (row + 1 if causal else end)] = 1
        return layout

    def set_global_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """Global columns (and rows if horizontal); indices beyond the sequence are ignored."""
        num_blocks = layout.shape[1]
        ends = self.global_block_end_indices
        if ends is None:
            ends = [start + 1 for start in self.global_block_indices]
        for start, end in zip(self.global_block_indices, ends):
            if start >= num_blocks:
                continue
            end = min(end, num_blocks)
            if self.horizontal_global_attention:
                layout[h, start:end, :] = 1
            first_row = 0 if self.attention == "bidirectional" else start
            layout[h, first_row:, start:end] = 1
        return layout

    def make_layout(self, seq_len: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Random, then local, then global blocks, per layout head; random draws agree across ranks."""
        layout = self.setup_layout(seq_len)
        rng = self._generator(generator)
        for h in range(self.num_layout_heads):
            self.set_random_layout(h, layout, rng)
            self.set_local_layout(h, layout)
            self.set_global_layout(h, layout)
        layout = self.check_and_propagate_first_head_layout(layout)
        return _broadcast_from_rank0(layout) if self.num_random_blocks else layout


class BigBirdSparsityConfig(_RandomLayoutMixin, SparsityConfig):
    """BigBird (Zaheer et al.): random blocks, a sliding window and leading global blocks.

    Args:
        num_random_blocks: random key blocks per row (from all blocks, or blocks <= row when causal).
        num_sliding_window_blocks: window width in blocks centred on the diagonal.
        num_global_blocks: leading blocks that attend to and are attended by every block.
        attention: 'bidirectional' or 'unidirectional' (the whole layout is made lower-triangular).
        seed: seeds the random blocks when make_layout gets no generator.
    """

    def __init__(
        self,
        num_heads: int,
        block: int = 16,
        different_layout_per_head: bool = False,
        num_random_blocks: int = 1,
        num_sliding_window_blocks: int = 3,
        num_global_blocks: int = 1,
        attention: str = "bidirectional",
        seed: int = 0,
    ) -> None:
        super().__init__(num_heads, block, different_layout_per_head)
        _check_attention(attention)
        self.num_random_blocks = num_random_blocks
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention
        self.seed = seed

    def set_random_layout(self, h: int, layout: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """num_random_blocks distinct random columns per row (only columns <= row when causal)."""
        num_blocks = layout.shape[1]
        _check_fits("random blocks", self.num_random_blocks, num_blocks)
        causal = self.attention == "unidirectional"
        if causal and self.num_random_blocks > 1:
            raise ValueError(
                f"Unidirectional BigBird draws row r's {self.num_random_blocks} random blocks from blocks "
                f"0..r, so row 0 has only 1 candidate; use num_random_blocks <= 1 or bidirectional attention."
            )
        for row in range(num_blocks):
            population = row + 1 if causal else num_blocks
            layout[h, row, _sample_columns(population, self.num_random_blocks, generator)] = 1
        return layout

    def set_sliding_window_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """Row r attends [r - w, r + w] with w = num_sliding_window_blocks // 2, clipped."""
        _check_fits("sliding window blocks", self.num_sliding_window_blocks, layout.shape[1])
        _sliding_window(layout, h, self.num_sliding_window_blocks, causal=False)
        return layout

    def set_global_layout_itc(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """The first num_global_blocks rows and columns are all ones (internal transformer construction)."""
        _check_fits("global blocks", self.num_global_blocks, layout.shape[1])
        layout[h, : self.num_global_blocks, :] = 1
        layout[h, :, : self.num_global_blocks] = 1
        return layout

    def make_layout(self, seq_len: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Random, sliding window, global; lower triangle only when unidirectional."""
        layout = self.setup_layout(seq_len)
        rng = self._generator(generator)
        for h in range(self.num_layout_heads):
            self.set_random_layout(h, layout, rng)
            self.set_sliding_window_layout(h, layout)
            self.set_global_layout_itc(h, layout)
        if self.attention == "unidirectional":
            layout = torch.tril(layout)
        layout = self.check_and_propagate_first_head_layout(layout)
        return _broadcast_from_rank0(layout) if self.num_random_blocks else layout


class BSLongformerSparsityConfig(SparsityConfig):
    """Block-sparse Longformer (Beltagy et al.): a sliding window plus global blocks or block ranges.

    Args:
        num_sliding_window_blocks: window width in blocks centred on the diagonal.
        global_block_indices: global blocks (or range starts when global_block_end_indices is given); a
            global block attends to every block and every block attends to it.
        global_block_end_indices: exclusive range ends, same length as global_block_indices.
        attention: 'bidirectional' or 'unidirectional' (the whole layout is made lower-triangular).
    """

    def __init__(
        self,
        num_heads: int,
        block: int = 16,
        different_layout_per_head: bool = False,
        num_sliding_window_blocks: int = 3,
        global_block_indices: Sequence[int] = (0,),
        global_block_end_indices: Sequence[int] | None = None,
        attention: str = "bidirectional",
    ) -> None:
        super().__init__(num_heads, block, different_layout_per_head)
        global_block_indices = list(global_block_indices)
        if global_block_end_indices is not None:
            global_block_end_indices = list(global_block_end_indices)
        _check_global_ranges(global_block_indices, global_block_end_indices)
        # DeepSpeed accepted any string here and silently treated it as bidirectional.
        _check_attention(attention)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.global_block_indices = global_block_indices
        self.global_block_end_indices = global_block_end_indices
        self.attention = attention

    def set_sliding_window_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """Row r attends [r - w, r + w] with w = num_sliding_window_blocks // 2, clipped."""
        _check_fits("sliding window blocks", self.num_sliding_window_blocks, layout.shape[1])
        _sliding_window(layout, h, self.num_sliding_window_blocks, causal=False)
        return layout

    def set_global_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """Full rows and columns for each global block or range; indices beyond the sequence ignored."""
        num_blocks = layout.shape[1]
        ends = self.global_block_end_indices
        if ends is None:
            ends = [start + 1 for start in self.global_block_indices]
        for start, end in zip(self.global_block_indices, ends):
            if start < num_blocks:
                layout[h, start : min(end, num_blocks), :] = 1
                layout[h, :, start : min(end, num_blocks)] = 1
        return layout

    def make_layout(self, seq_len: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sliding window, then global; lower triangle only when unidirectional."""
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_sliding_window_layout(h, layout)
            self.set_global_layout(h, layout)
        if self.attention == "unidirectional":
            layout = torch.tril(layout)
        return self.check_and_propagate_first_head_layout(layout)


class LocalSlidingWindowSparsityConfig(SparsityConfig):
    """A sliding window only: row r attends [r - w, r] (unidirectional) or [r - w, r + w].

    Args:
        num_sliding_window_blocks: window width in blocks; w = num_sliding_window_blocks // 2.
        attention: 'unidirectional' (the default, as in DeepSpeed) or 'bidirectional'.
    """

    def __init__(
        self,
        num_heads: int,
        block: int = 16,
        num_sliding_window_blocks: int = 3,
        attention: str = "unidirectional",
    ) -> None:
        super().__init__(num_heads, block, different_layout_per_head=False)
        _check_attention(attention)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.attention = attention

    def set_sliding_window_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """The window of every row, causal when unidirectional."""
        _check_fits("sliding window blocks", self.num_sliding_window_blocks, layout.shape[1])
        causal = self.attention == "unidirectional"
        _sliding_window(layout, h, self.num_sliding_window_blocks, causal=causal)
        return layout

    def make_layout(self, seq_len: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """The sliding window, identical for every head."""
        layout = self.setup_layout(seq_len)
        self.set_sliding_window_layout(0, layout)
        return self.check_and_propagate_first_head_layout(layout)
