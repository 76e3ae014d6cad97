"""A small GPT (decoder-only transformer) whose attention is ds-sparse-attn's block-sparse attention.

Shapes follow nanoGPT's notation: B batch, T sequence length, C embedding width (n_embd), nh heads,
hs head size (C // nh), V vocabulary (256 bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import ds_sparse_attn
import torch
import torch.nn.functional as F
from torch import nn

VOCAB_SIZE = 256  # one token per byte


class Linear(nn.Linear):
    """``nn.Linear`` whose bf16/fp16 matmul runs in fp32 on CPU; weights, activations and grads keep their dtype.

    CPUs without native half-precision matmul (AVX2 only) run bf16 GEMMs several times slower than fp32
    ones; ds-sparse-attn computes its attention in fp32 for the same reason. On GPUs it is a plain Linear.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16):
            return super().forward(x)
        bias = self.bias.float() if self.bias is not None else None
        return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)


@dataclass(frozen=True)
class GPTConfig:
    """Model shape. ``block_size`` is the longest sequence the position table covers."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")


# name -> (n_layer, n_head, n_embd)
MODEL_PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 2, 64),
    "small": (4, 4, 128),
    "medium": (6, 6, 192),
}


class CausalSparseSelfAttention(nn.Module):
    """Multi-head causal self-attention computed only on the blocks of a sparsity layout.

    The layout decides which (query block, key block) tiles exist at all; a lower-triangular
    ``attn_mask`` on top makes it causal inside the diagonal tiles (and for layouts such as BigBird's
    global rows, which a unidirectional layout alone would leave looking ahead).
    """

    def __init__(self, config: GPTConfig, attention: ds_sparse_attn.SparseSelfAttention) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = Linear(config.n_embd, 3 * config.n_embd)
        self.proj = Linear(config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)
        self.attention = attention
        causal = torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.uint8))
        self.register_buffer("causal_mask", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (
            t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)
        )  # (B, nh, T, hs)
        y = self.attention(q, k, v, attn_mask=self.causal_mask[:T, :T])  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.dropout(self.proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: C -> 4C -> C."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = Linear(config.n_embd, 4 * config.n_embd)
        self.proj = Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))  # (B, T, C)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig, attention: ds_sparse_attn.SparseSelfAttention) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSparseSelfAttention(config, attention)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# checkpoint(fn, *args) -> output: recomputes fn in backward instead of keeping its activations
CheckpointFn = Callable[..., torch.Tensor]


class GPT(nn.Module):
    """Byte-level GPT. ``make_attention()`` builds one sparse attention module per block.

    ``checkpoint_fn`` (e.g. ``ds_checkpoint.activation.checkpoint``) wraps every block in activation
    checkpointing while training: only each block's input is kept, the rest is recomputed in backward.
    """

    def __init__(
        self,
        config: GPTConfig,
        make_attention: Callable[[], ds_sparse_attn.SparseSelfAttention],
        checkpoint_fn: CheckpointFn | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.checkpoint_fn = checkpoint_fn
        self.wte = nn.Embedding(VOCAB_SIZE, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, make_attention()) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = Linear(config.n_embd, VOCAB_SIZE)
        self.apply(_init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / (2 * config.n_layer) ** 0.5)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) for byte ids ``idx`` (B, T); with ``targets`` (B, T), the mean cross-entropy."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}")
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            if self.checkpoint_fn is not None and self.training:
                x = self.checkpoint_fn(block, x)
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits
        # the loss in fp32 whatever the weights' dtype: log-softmax over 256 classes loses bits in bf16
        return F.cross_entropy(logits.float().view(-1, VOCAB_SIZE), targets.reshape(-1))

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.8,
        top_k: int | None = 40,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Extend ``idx`` (B, T) by ``max_new_tokens`` sampled bytes; temperature 0 means greedy."""
        block = self.blocks[0].attn.attention.sparsity_config.block
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.config.block_size :]  # (B, <=block_size)
            # sparse attention needs T to be a multiple of its block: left-pad with spaces, which the
            # causal mask cannot hide but which read like the indentation the model has seen plenty of
            pad = (-ctx.shape[1]) % block
            if pad and ctx.shape[1] + pad <= self.config.block_size:
                ctx = torch.cat(
                    [torch.full((ctx.shape[0], pad), ord(" "), dtype=ctx.dtype, device=ctx.device), ctx], 1
                )
            elif pad:
                ctx = ctx[:, pad:]
            logits = self(ctx)[:, -1, :].float()  # (B, V)
            if temperature <= 0:
                nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, VOCAB_SIZE)).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
