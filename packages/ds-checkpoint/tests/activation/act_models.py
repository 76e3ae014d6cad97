"""Small models with dropout shared by the activation-checkpointing tests."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class Block(nn.Module):
    """A pre-norm transformer block with dropout on attention probabilities, attention output and MLP."""

    def __init__(self, width: int = 16, heads: int = 2, dropout: float = 0.2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = self.drop(
            torch.softmax(q @ k.transpose(-1, -2) / (c // self.heads) ** 0.5, dim=-1)
        )  # (B, nh, T, T)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x)))))


def make_blocks(n: int, seed: int = 0, width: int = 16) -> nn.ModuleList:
    torch.manual_seed(seed)
    return nn.ModuleList(Block(width) for _ in range(n))


def run_blocks(
    blocks: nn.ModuleList, x: torch.Tensor, wrap: Callable | None, seed: int = 123
) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """Forward + backward from a fixed RNG seed; returns (loss, parameter grads, input grad)."""
    for p in blocks.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    torch.manual_seed(seed)
    h = x
    for block in blocks:
        h = wrap(block, h) if wrap is not None else block(h)
    loss = (h * h).mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in blocks.parameters()], x.grad.clone()


def assert_same_run(a, b) -> None:
    """Bitwise equality of loss, every parameter gradient and the input gradient."""
    assert torch.equal(a[0], b[0])
    assert len(a[1]) == len(b[1])
    for ga, gb in zip(a[1], b[1]):
        assert torch.equal(ga, gb)
    assert torch.equal(a[2], b[2])
