"""SparseAttentionUtils: padding to the block size and converting BERT/RoBERTa-style models."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._attention import BertSparseSelfAttention
from ._layouts import FixedSparsityConfig, SparsityConfig

_SUPPORTED = 'It currently only supports "bert" & "roberta"!'


def _backbone(model: nn.Module) -> tuple[str, nn.Module]:
    for name in ("bert", "roberta"):
        if hasattr(model, name):
            return name, getattr(model, name)
    raise ValueError(
        f"Please extend this function to support your model type ({type(model).__name__}). {_SUPPORTED}"
    )


def _resize_position_buffers(embeddings: nn.Module, num_positions: int) -> None:
    """transformers keeps `position_ids`/`token_type_ids` buffers sized to the table; extend them too."""
    for name in ("position_ids", "token_type_ids"):
        buffer = getattr(embeddings, name, None)
        if isinstance(buffer, torch.Tensor) and buffer.shape[-1] < num_positions:
            if name == "position_ids":
                new = torch.arange(num_positions, dtype=buffer.dtype, device=buffer.device)
            else:
                new = torch.zeros(num_positions, dtype=buffer.dtype, device=buffer.device)
            embeddings.register_buffer(
                name, new.expand(*buffer.shape[:-1], num_positions).clone(), persistent=False
            )


class SparseAttentionUtils:
    """Helpers to use sparse attention in pretrained BERT/RoBERTa-style models (all static)."""

    @staticmethod
    def extend_position_embedding(model: nn.Module, max_position: int) -> nn.Module:
        """Grow the position embedding table to `max_position` positions by tiling the trained rows.

        BERT: rows are repeated cyclically to exactly max_position rows. RoBERTa (positions 0 and 1 are
        reserved): rows 0-1 are kept and rows 2.. are tiled, max_position + 2 rows in all. Sets
        `config.max_position_embeddings`. (DeepSpeed left rows uninitialised when max_position was not a
        multiple of the original size, and for RoBERTa rows 0-1 too.)
        """
        name, backbone = _backbone(model)
        embedding = backbone.embeddings.position_embeddings
        weight = embedding.weight
        reserved = 2 if name == "roberta" else 0
        original = weight.shape[0] - reserved
        if max_position <= original:
            raise ValueError(
                f"max_position ({max_position}) must be larger than the current number of positions ({original})."
            )
        trained = weight.data[reserved:]
        repeats = -(-max_position // original)
        tiled = trained.repeat(repeats, 1)[:max_position]
        new_weight = torch.cat([weight.data[:reserved], tiled], dim=0)
        embedding.weight = nn.Parameter(new_weight, requires_grad=weight.requires_grad)
        embedding.num_embeddings = new_weight.shape[0]
        _resize_position_buffers(backbone.embeddings, new_weight.shape[0])
        model.config.max_position_embeddings = new_weight.shape[0]
        return model

    @staticmethod
    def update_tokenizer_model_max_length(tokenizer: Any, max_position: int) -> Any:
        """Let the tokenizer produce sequences up to `max_position` tokens."""
        tokenizer.model_max_length = max_position
        tokenizer.init_kwargs["model_max_length"] = max_position
        return tokenizer

    @staticmethod
    def replace_model_self_attention_with_sparse_self_attention(
        model: nn.Module, max_position: int, sparsity_config: SparsityConfig | None = None
    ) -> nn.Module:
        """Replace every encoder layer's self-attention of a BERT/RoBERTa model with BertSparseSelfAttention.

        The original query/key/value projections are kept (weights shared, not copied). Sets
        `config.max_position_embeddings` to max_position (RoBERTa: max_position + 2).
        """
        name, backbone = _backbone(model)
        model.config.max_position_embeddings = max_position + (2 if name == "roberta" else 0)
        if sparsity_config is None:
            sparsity_config = FixedSparsityConfig(num_heads=model.config.num_attention_heads)
        SparseAttentionUtils.replace_self_attention_layer_with_sparse_self_attention_layer(
            model.config, backbone.encoder.layer, sparsity_config
        )
        return model

    @staticmethod
    def replace_self_attention_layer_with_sparse_self_attention_layer(
        config: Any, layers: nn.ModuleList, sparsity_config: SparsityConfig | None = None
    ) -> nn.ModuleList:
        """Swap `layer.attention.self` of each layer for a BertSparseSelfAttention reusing its projections."""
        for layer in layers:
            original = layer.attention.self
            sparse = BertSparseSelfAttention(config, sparsity_config, return_tuple=True)
            sparse.query, sparse.key, sparse.value = original.query, original.key, original.value
            layer.attention.self = sparse.to(original.query.weight.device)
        return layers

    @staticmethod
    def pad_to_block_size(
        block_size: int,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        pad_token_id: int,
        model_embeddings: nn.Module | None,
    ) -> tuple[int, Any, Any, Any, Any, Any]:
        """Right-pad a batch to a multiple of block_size.

        Returns (pad_len, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds). input_ids
        and position_ids are padded with pad_token_id, attention_mask with 0, token_type_ids with 0,
        inputs_embeds with `model_embeddings(pad ids)`. Undo on the output with unpad_sequence_output.
        """
        reference = input_ids if input_ids is not None else inputs_embeds
        if reference is None:
            raise ValueError("pad_to_block_size needs input_ids or inputs_embeds.")
        batch, seq_len = reference.shape[0], reference.shape[1]
        pad_len = (block_size - seq_len % block_size) % block_size
        if pad_len == 0:
            return 0, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds

        def pad(t: torch.Tensor | None, value: int | bool) -> torch.Tensor | None:
            return None if t is None else nn.functional.pad(t, (0, pad_len), value=value)

        if inputs_embeds is not None:
            if model_embeddings is None:
                raise ValueError("pad_to_block_size needs model_embeddings to pad inputs_embeds.")
            pad_ids = inputs_embeds.new_full((batch, pad_len), pad_token_id, dtype=torch.long)
            inputs_embeds = torch.cat([inputs_embeds, model_embeddings(pad_ids)], dim=-2)
        mask_fill = False if attention_mask is not None and attention_mask.dtype == torch.bool else 0
        return (
            pad_len,
            pad(input_ids, pad_token_id),
            pad(attention_mask, mask_fill),
            pad(token_type_ids, 0),
            pad(position_ids, pad_token_id),
            inputs_embeds,
        )

    @staticmethod
    def unpad_sequence_output(pad_len: int, sequence_output: torch.Tensor) -> torch.Tensor:
        """Drop the pad_len positions pad_to_block_size added: (B, L + pad, ...) -> (B, L, ...)."""
        return sequence_output[:, :-pad_len] if pad_len > 0 else sequence_output
