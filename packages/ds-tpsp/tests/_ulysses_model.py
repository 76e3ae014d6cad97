"""A tiny Ulysses language model (batch-first ``[b, s, h, d]``) and a training loop, for the multi-rank tests."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ds_tpsp.sequence import DistributedAttention
from torch import nn

VOCAB, DIM, HEADS, LAYERS, BATCH, SEQ = 64, 32, 4, 2, 2, 32


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over ``[b, s, h, d]`` tensors (torch's kernel wants ``[b, h, s, d]``)."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return out.transpose(1, 2)


class Block(nn.Module):
    def __init__(self, group, heads: int = HEADS, dim: int = DIM, local_attention=causal_sdpa) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        # group None: the whole sequence on one rank, the local attention alone (the reference)
        self.attn = local_attention if group is None else DistributedAttention(local_attention, group, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).unflatten(-1, (3, self.heads, -1)).unbind(2)
        a = self.attn(q, k, v, 0) if isinstance(self.attn, DistributedAttention) else self.attn(q, k, v)
        x = x + self.proj(a.flatten(2))
        return x + self.mlp(self.norm2(x))


class UlyssesLM(nn.Module):
    def __init__(self, group=None, heads: int = HEADS, local_attention=causal_sdpa) -> None:
        super().__init__()
        self.group = group
        self.emb, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList(
            Block(group, heads, local_attention=local_attention) for _ in range(LAYERS)
        )
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over this rank's slice of the sequence (the positions are global)."""
        start = 0 if self.group is None else dist.get_rank(self.group) * tokens.shape[1]
        x = self.emb(tokens) + self.pos(torch.arange(start, start + tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.norm(x)).flatten(0, 1), labels.flatten())


def batches(steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def train(group, steps: int = 4, heads: int = HEADS) -> list[float]:
    """Train from seed 0 with Adam; under a group, each rank takes its slice of every sequence, the
    gradients are summed over the group and divided by its size (the mean of equal-sized slices' losses)."""
    torch.manual_seed(0)
    model = UlyssesLM(group, heads)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    p = 1 if group is None else dist.get_world_size(group)
    r = 0 if group is None else dist.get_rank(group)
    losses = []
    for tokens, labels in batches(steps):
        n = tokens.shape[1] // p
        loss = model(tokens[:, r * n : (r + 1) * n], labels[:, r * n : (r + 1) * n])
        opt.zero_grad()
        loss.backward()
        reported = loss.detach().clone()
        if group is not None:
            for param in model.parameters():
                dist.all_reduce(param.grad, group=group)
                param.grad /= p
            dist.all_reduce(reported, group=group)
            reported /= p
        opt.step()
        losses.append(reported.item())
    return losses
