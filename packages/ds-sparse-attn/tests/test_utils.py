"""SparseAttentionUtils on a small BERT/RoBERTa-shaped model built from plain torch modules."""

from __future__ import annotations

import types

import pytest
import torch
from ds_sparse_attn import (
    BertSparseSelfAttention,
    DenseSparsityConfig,
    FixedSparsityConfig,
    SparseAttentionUtils,
)
from torch import nn

HIDDEN, HEADS, LAYERS = 8, 2, 2


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = (
            nn.Linear(HIDDEN, HIDDEN),
            nn.Linear(HIDDEN, HIDDEN),
            nn.Linear(HIDDEN, HIDDEN),
        )

    def forward(self, hidden, attention_mask=None, *args, **kwargs):
        batch, seq_len, _ = hidden.shape

        def split(x):
            return x.view(batch, seq_len, HEADS, -1).transpose(1, 2)

        q, k, v = split(self.query(hidden)), split(self.key(hidden)), split(self.value(hidden))
        scores = q @ k.transpose(-1, -2) / (HIDDEN // HEADS) ** 0.5
        if attention_mask is not None:
            scores = scores + attention_mask
        context = torch.softmax(scores, -1) @ v
        return (context.transpose(1, 2).reshape(batch, seq_len, HIDDEN),)


class Layer(nn.Module):
    """transformers' layout: layer.attention.self, called with (hidden, mask, ...) and returning a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = SelfAttention()

    def forward(self, hidden, attention_mask):
        return hidden + self.attention.self(hidden, attention_mask, None, None)[0]


class Embeddings(nn.Module):
    def __init__(self, positions: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(50, HIDDEN)
        self.position_embeddings = nn.Embedding(positions, HIDDEN)
        self.register_buffer("position_ids", torch.arange(positions).expand(1, -1), persistent=False)

    def forward(self, input_ids):
        return self.word_embeddings(input_ids) + self.position_embeddings(
            self.position_ids[:, : input_ids.shape[1]]
        )


class Backbone(nn.Module):
    def __init__(self, positions: int) -> None:
        super().__init__()
        self.embeddings = Embeddings(positions)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(Layer() for _ in range(LAYERS))

    def forward(self, input_ids, attention_mask):
        hidden = self.embeddings(input_ids)
        extended = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
        for layer in self.encoder.layer:
            hidden = layer(hidden, extended)
        return hidden


def make_model(kind: str, positions: int = 16) -> nn.Module:
    model = nn.Module()
    setattr(model, kind, Backbone(positions + (2 if kind == "roberta" else 0)))
    model.config = types.SimpleNamespace(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        max_position_embeddings=positions + (2 if kind == "roberta" else 0),
    )
    return model


def test_pad_and_unpad() -> None:
    ids = torch.arange(10).view(2, 5)
    mask = torch.ones(2, 5, dtype=torch.long)
    types_ = torch.ones(2, 5, dtype=torch.long)
    embeddings = nn.Embedding(20, 3)
    embeds = torch.randn(2, 5, 3)
    pad_len, p_ids, p_mask, p_types, p_pos, p_embeds = SparseAttentionUtils.pad_to_block_size(
        4, ids, mask, types_, ids.clone(), embeds, pad_token_id=7, model_embeddings=embeddings
    )
    assert pad_len == 3
    assert p_ids.tolist()[0] == [0, 1, 2, 3, 4, 7, 7, 7]
    assert p_mask[:, 5:].eq(0).all() and p_types[:, 5:].eq(0).all() and p_pos[:, 5:].eq(7).all()
    torch.testing.assert_close(p_embeds[:, 5:], embeddings(torch.full((2, 3), 7)))
    assert SparseAttentionUtils.unpad_sequence_output(pad_len, torch.randn(2, 8, 3)).shape == (2, 5, 3)
    same = SparseAttentionUtils.pad_to_block_size(5, ids, mask, None, None, None, 0, None)
    assert same[0] == 0 and same[1] is ids and same[3] is None
    out = torch.randn(2, 5, 3)
    assert SparseAttentionUtils.unpad_sequence_output(0, out) is out


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_replace_self_attention_keeps_projections_and_runs(kind: str) -> None:
    torch.manual_seed(0)
    model = make_model(kind)
    backbone = getattr(model, kind)
    original_query = backbone.encoder.layer[0].attention.self.query
    ids = torch.randint(0, 50, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    dense_out = backbone(ids, mask)
    # a dense layout makes the sparse model compute exactly what the original did
    config = FixedSparsityConfig(HEADS, block=4, num_local_blocks=4)
    SparseAttentionUtils.replace_model_self_attention_with_sparse_self_attention(
        model, 16, DenseSparsityConfig(HEADS, 4)
    )
    sparse = backbone.encoder.layer[0].attention.self
    assert isinstance(sparse, BertSparseSelfAttention) and sparse.query is original_query
    assert model.config.max_position_embeddings == 16 + (2 if kind == "roberta" else 0)
    torch.testing.assert_close(backbone(ids, mask), dense_out, atol=1e-5, rtol=1e-5)
    SparseAttentionUtils.replace_self_attention_layer_with_sparse_self_attention_layer(
        model.config, backbone.encoder.layer, config
    )
    backbone(ids, mask).sum().backward()
    assert original_query.weight.grad is not None


def test_replace_rejects_other_models() -> None:
    with pytest.raises(ValueError, match='only supports "bert" & "roberta"'):
        SparseAttentionUtils.replace_model_self_attention_with_sparse_self_attention(nn.Linear(2, 2), 8)
    with pytest.raises(ValueError, match='only supports "bert" & "roberta"'):
        SparseAttentionUtils.extend_position_embedding(nn.Linear(2, 2), 8)


def test_extend_position_embedding_bert() -> None:
    model = make_model("bert", positions=6)
    weight = model.bert.embeddings.position_embeddings.weight.detach().clone()
    SparseAttentionUtils.extend_position_embedding(model, 16)
    new = model.bert.embeddings.position_embeddings
    assert new.weight.shape == (16, HIDDEN) and new.num_embeddings == 16
    torch.testing.assert_close(new.weight[6:12], weight)
    torch.testing.assert_close(new.weight[12:16], weight[:4])
    assert model.config.max_position_embeddings == 16
    model.bert(torch.randint(0, 50, (1, 16)), torch.ones(1, 16))  # position_ids buffer grew too
    with pytest.raises(ValueError, match="must be larger"):
        SparseAttentionUtils.extend_position_embedding(model, 8)


def test_extend_position_embedding_roberta() -> None:
    model = make_model("roberta", positions=4)
    weight = model.roberta.embeddings.position_embeddings.weight.detach().clone()
    SparseAttentionUtils.extend_position_embedding(model, 8)
    new = model.roberta.embeddings.position_embeddings.weight
    assert new.shape == (10, HIDDEN) and model.config.max_position_embeddings == 10
    torch.testing.assert_close(new[:2], weight[:2])  # reserved rows kept, not left uninitialised
    torch.testing.assert_close(new[2:6], weight[2:])
    torch.testing.assert_close(new[6:10], weight[2:])


def test_update_tokenizer_model_max_length() -> None:
    tokenizer = types.SimpleNamespace(model_max_length=512, init_kwargs={})
    SparseAttentionUtils.update_tokenizer_model_max_length(tokenizer, 4096)
    assert tokenizer.model_max_length == 4096 and tokenizer.init_kwargs["model_max_length"] == 4096
