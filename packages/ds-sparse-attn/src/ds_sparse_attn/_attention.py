"""SparseSelfAttention and BertSparseSelfAttention: the modules users put in their models."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from . import _backend, _flex_attention, _grouped_attention
from ._bias import ScoreBias
from ._layouts import FixedSparsityConfig, SparsityConfig
from ._numba_attention import numba_attention
from ._plan import BlockSparsePlan
from ._torch_attention import BlockSparseAttentionFunction

_MASK_MODES = ("add", "mul")


def _check_mode(name: str, mode: str) -> None:
    if mode not in _MASK_MODES:
        raise ValueError(
            f"{name} must be 'add' (added to the scores) or 'mul' (0 = masked out), got {mode!r}."
        )


def _additive(mask: torch.Tensor, mode: str, dtype: torch.dtype) -> torch.Tensor:
    """'add': the mask is added as it is; 'mul': 0 -> -inf (masked out), anything else -> 0."""
    mask = mask.to(dtype)
    if mode == "add":
        return mask
    return torch.zeros_like(mask).masked_fill_(mask == 0, float("-inf"))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half types are computed in fp32: fp16 matmuls on CPU are orders of magnitude slower, and the softmax
    # is more accurate; float64 stays float64 so gradients can be checked exactly.
    return torch.float64 if dtype == torch.float64 else torch.float32


class SparseSelfAttention(nn.Module):
    """Block-sparse scaled dot-product self-attention.

    Args:
        sparsity_config: the layout; default `FixedSparsityConfig(num_heads=4)` (a single layout shared by
            every head, so it serves any head count).
        key_padding_mask_mode: 'add' (mask values added to the scores) or 'mul' (0 masks a key out).
        attn_mask_mode: 'add' or 'mul', for the (L, L) attention mask.
        max_seq_length: the layout is built once for this length; shorter inputs use its top-left corner.
        backend: 'auto' (per device and dtype: on CUDA compiled FlexAttention when it compiles, else the
            Numba kernels, else the torch path; on CPU the torch path), 'flex' (FlexAttention with a BlockMask
            built from the layout; falls back with a logged reason where it cannot run), 'torch' (on CPU
            torch's fused flash kernel over groups of rows sharing their key blocks, else batched matmuls over
            gathered blocks), 'torch-gather' (always the gathered matmuls), or 'numba' (require the flash-style
            Numba kernels). With 'auto', the environment variable DS_SPARSE_ATTN_BACKEND forces one of these.
            The path taken is logged once (logger 'ds_sparse_attn') and shown in the module's repr.
    """

    def __init__(
        self,
        sparsity_config: SparsityConfig | None = None,
        key_padding_mask_mode: str = "add",
        attn_mask_mode: str = "mul",
        max_seq_length: int = 2048,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        _check_mode("key_padding_mask_mode", key_padding_mask_mode)
        _check_mode("attn_mask_mode", attn_mask_mode)
        _backend.requested(backend)  # validates the argument and the environment variable now
        self.sparsity_config = (
            sparsity_config if sparsity_config is not None else FixedSparsityConfig(num_heads=4)
        )
        self.key_padding_mask_mode = key_padding_mask_mode
        self.attn_mask_mode = attn_mask_mode
        self.max_seq_length = max_seq_length
        self.backend = backend
        self.register_buffer("master_layout", self.sparsity_config.make_layout(max_seq_length))
        self._plans: dict[tuple[int, int, torch.device], BlockSparsePlan] = {}
        self._flex_masks: dict[tuple[int, int, torch.device], tuple[object, dict[str, int] | None]] = {}
        self.chosen: dict[str, str] = {}  # "device dtype" -> path of the last call, for the repr

    def extra_repr(self) -> str:
        chosen = ", ".join(f"{where}: {path}" for where, path in self.chosen.items()) or "none yet"
        return f"backend={_backend.requested(self.backend)!r}, paths taken: {chosen}"

    def _plan(self, seq_len: int, num_heads: int, device: torch.device) -> BlockSparsePlan:
        key = (seq_len, num_heads, device)
        if key not in self._plans:
            block = self.sparsity_config.block
            nb = seq_len // block
            layout = self.master_layout[:, :nb, :nb]
            if layout.shape[0] != num_heads:
                if self.sparsity_config.different_layout_per_head:
                    raise ValueError(
                        f"The layout has {layout.shape[0]} per-head layouts but the input has {num_heads} heads; "
                        f"build the sparsity config with num_heads={num_heads}."
                    )
                layout = layout[:1].expand(num_heads, nb, nb)
            self._plans[key] = BlockSparsePlan(layout, block, device)
        return self._plans[key]

    def _flex_mask(self, plan: BlockSparsePlan, seq_len: int) -> tuple[object, dict[str, int] | None]:
        key = (seq_len, plan.num_heads, plan.device)
        if key not in self._flex_masks:
            layout = plan.layout
            if layout.shape[0] > 1 and bool((layout == layout[:1]).all()):
                layout = layout[:1]  # one layout for every head: a BlockMask with a head dim of 1
            tile = _flex_attention.tile_size(plan.block, plan.num_blocks, plan.device)
            mask = _flex_attention.block_mask(layout, plan.block, tile)
            self._flex_masks[key] = (mask, _flex_attention.kernel_options(tile))
        return self._flex_masks[key]

    def _check_inputs(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if query.dim() != 4:
            raise ValueError(f"query must be (batch, heads, seq, head_dim), got shape {tuple(query.shape)}.")
        if key.shape != query.shape and key.shape == query.transpose(-1, -2).shape:
            key = key.transpose(-1, -2)  # DeepSpeed accepted keys already transposed as (B, H, D, L)
        if not (query.shape == key.shape == value.shape):
            raise NotImplementedError(
                "only self-attention is supported for now: query, key and value must have the same shape, got "
                f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}."
            )
        if not query.is_floating_point():
            raise TypeError(f"query/key/value must be floating point, got {query.dtype}.")
        seq_len, block = query.shape[2], self.sparsity_config.block
        if seq_len % block != 0:
            raise ValueError(
                f"Sequence Length, {seq_len}, needs to be dividable by Block size {block}! Pad the inputs with "
                "SparseAttentionUtils.pad_to_block_size and unpad the output with unpad_sequence_output."
            )
        if seq_len > self.max_seq_length:
            raise ValueError(
                f"Sequence length {seq_len} exceeds max_seq_length={self.max_seq_length}; build "
                f"SparseSelfAttention with max_seq_length >= {seq_len}."
            )
        return query, key, value

    def _score_bias(
        self,
        query: torch.Tensor,
        rpe: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> ScoreBias:
        batch, heads, seq_len, _ = query.shape
        if rpe is not None:
            if rpe.dim() < 2 or rpe.dim() > 4 or rpe.shape[-2:] != (seq_len, seq_len):
                raise ValueError(
                    f"rpe must be (L, L), (H, L, L) or (B, H, L, L) with L={seq_len}, got {tuple(rpe.shape)}."
                )
            rpe = rpe.reshape((1,) * (4 - rpe.dim()) + tuple(rpe.shape)).to(dtype)
            if rpe.shape[0] not in (1, batch) or rpe.shape[1] not in (1, heads):
                raise ValueError(
                    f"rpe batch/head dims must be 1 or ({batch}, {heads}), got {tuple(rpe.shape)}."
                )
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.reshape(key_padding_mask.shape[0], -1)
            if key_padding_mask.shape != (batch, seq_len):
                raise ValueError(
                    f"key_padding_mask must squeeze to (batch, seq) = ({batch}, {seq_len}), got shape "
                    f"{tuple(key_padding_mask.shape)} after squeezing."
                )
            key_padding_mask = _additive(key_padding_mask, self.key_padding_mask_mode, dtype)
        if attn_mask is not None:
            while attn_mask.dim() > 2 and attn_mask.shape[0] == 1:
                attn_mask = attn_mask.squeeze(0)
            if attn_mask.shape != (seq_len, seq_len):
                raise ValueError(
                    f"attn_mask must be a 2-D (seq, seq) = ({seq_len}, {seq_len}) mask (leading dims of size 1 "
                    f"are squeezed), got {tuple(attn_mask.shape)}."
                )
            attn_mask = _additive(attn_mask, self.attn_mask_mode, dtype)
        return ScoreBias(rpe, key_padding_mask, attn_mask)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        rpe: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention output (B, H, L, D) for query/key/value (B, H, L, D), L a multiple of the block.

        rpe: relative position bias (L, L), (H, L, L) or (B, H, L, L), added to the scaled scores (only
        its present blocks are read; it receives a gradient). key_padding_mask: (B, L) (extra size-1 dims
        allowed). attn_mask: (L, L). Masks follow key_padding_mask_mode / attn_mask_mode.
        """
        query, key, value = self._check_inputs(query, key, value)
        dtype = _compute_dtype(query.dtype)
        batch, heads, seq_len, dim = query.shape
        plan = self._plan(seq_len, heads, query.device)
        bias = self._score_bias(query, rpe, key_padding_mask, attn_mask, dtype)
        scale = dim**-0.5
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (query, key, value, rpe)
        )
        path = _backend.choose(_backend.requested(self.backend), query, plan.block, needs_grad)
        self.chosen[f"{query.device.type} {str(query.dtype).removeprefix('torch.')}"] = path
        if path == "flex":  # in the input dtype (tensor cores for fp16/bf16); the bias in fp32
            mask, options = self._flex_mask(plan, seq_len)
            return _flex_attention.attend(query, key, value, mask, bias, scale, options)
        if path == "numba":
            q, k, v = (t.float().contiguous() for t in (query, key, value))
            out = numba_attention(q, k, v, bias, plan, scale)
            return out.to(query.dtype)
        q, k, v = (t.to(dtype).contiguous() for t in (query, key, value))
        if path == "torch" and _grouped_attention.usable(q, bias.rpe):
            out = _grouped_attention.GroupedFlashAttentionFunction.apply(
                q, k, v, bias.rpe, bias.key_padding, bias.attn, plan, scale
            )
        else:
            out = BlockSparseAttentionFunction.apply(
                q, k, v, bias.rpe, bias.key_padding, bias.attn, plan, scale
            )
        return out.to(query.dtype)


class BertSparseSelfAttention(nn.Module):
    """BERT's self-attention (query/key/value projections) with SparseSelfAttention inside.

    Args:
        config: any object with `hidden_size` and `num_attention_heads` (a transformers BertConfig works).
        sparsity_config: the layout; default `FixedSparsityConfig(num_heads=config.num_attention_heads)`.
        return_tuple: return `(context,)` as transformers' BertSelfAttention does (set when it replaces one).
    """

    def __init__(
        self, config: Any, sparsity_config: SparsityConfig | None = None, return_tuple: bool = False
    ) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        if hidden % heads != 0:
            raise ValueError(
                f"The hidden size ({hidden}) is not a multiple of the number of attention heads ({heads})"
            )
        self.num_attention_heads = heads
        self.attention_head_size = hidden // heads
        self.all_head_size = hidden
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        if sparsity_config is None:
            sparsity_config = FixedSparsityConfig(num_heads=heads)
        block = sparsity_config.block
        max_positions = getattr(config, "max_position_embeddings", 0) or 0
        max_seq_length = max(2048, math.ceil(max_positions / block) * block)
        self.sparse_self_attention = SparseSelfAttention(sparsity_config, max_seq_length=max_seq_length)
        self.return_tuple = return_tuple

    def transpose_for_scores(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, hidden) -> (B, heads, L, head_dim)."""
        batch, seq_len, _ = x.shape
        return x.view(batch, seq_len, self.num_attention_heads, self.attention_head_size).permute(0, 2, 1, 3)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor | tuple[torch.Tensor]:
        """Context (B, L, hidden); attention_mask is the key padding mask (additive by default, as BERT's
        extended mask is). Extra positional/keyword arguments from transformers are accepted and ignored."""
        query = self.transpose_for_scores(self.query(hidden_states))
        key = self.transpose_for_scores(self.key(hidden_states))
        value = self.transpose_for_scores(self.value(hidden_states))
        context = self.sparse_self_attention(query, key, value, key_padding_mask=attention_mask)
        batch, _, seq_len, _ = context.shape
        context = context.permute(0, 2, 1, 3).reshape(batch, seq_len, self.all_head_size)
        return (context,) if self.return_tuple else context
