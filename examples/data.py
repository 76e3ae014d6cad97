"""The corpus: this Python's own standard library sources, as bytes, on every machine without downloads.

The file list is sorted, so every rank and every rerun sees the same bytes; every ``VAL_EVERY``-th file
goes to validation, so validation text comes from files the model never trained on.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

VAL_EVERY = 10  # file i goes to validation when i % VAL_EVERY == VAL_EVERY - 1


@dataclass(frozen=True)
class Corpus:
    """Train and validation bytes as uint8 tensors, and where they came from."""

    train: torch.Tensor  # (N_train,) uint8
    val: torch.Tensor  # (N_val,) uint8
    root: Path
    num_files: int


def stdlib_dir() -> Path:
    """The directory of the standard library's pure-Python modules (where ``os.py`` lives)."""
    return Path(os.__file__).resolve().parent


def load_corpus(max_bytes: int, root: Path | None = None) -> Corpus:
    """Read sorted ``*.py`` files directly under ``root`` until ``max_bytes`` are collected.

    Only the top level of the stdlib (no ``site-packages``, no test suites): the same text on every
    installation of one Python version.
    """
    root = root or stdlib_dir()
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if not files:
        raise FileNotFoundError(
            f"no *.py files under {root}: the corpus is the Python standard library's source"
        )
    train, val, total = [], [], 0
    for i, path in enumerate(files):
        data = path.read_bytes()
        (val if i % VAL_EVERY == VAL_EVERY - 1 else train).append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return Corpus(_to_tensor(train), _to_tensor(val), root, i + 1)


def _to_tensor(chunks: list[bytes]) -> torch.Tensor:
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


def unigram_entropy_nats(data: torch.Tensor) -> float:
    """Entropy of the byte histogram of ``data``: the loss of the best model that ignores context."""
    counts = torch.bincount(data.long(), minlength=256).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def nats_to_bits(nats: float) -> float:
    return nats / math.log(2)


class WindowSampler:
    """Random (seq_len + 1)-byte windows of the training bytes, in an order fixed by the seed.

    ``position`` counts windows handed out by the whole job (all ranks); it is all a checkpoint needs to
    resume the data stream, at any world size: step s at world size W takes windows
    ``[position, position + W * micro_batch)`` and rank r its r-th slice of them.
    """

    def __init__(self, data: torch.Tensor, seq_len: int, seed: int, position: int = 0) -> None:
        if len(data) <= seq_len + 1:
            raise ValueError(
                f"the training text ({len(data)} bytes) is shorter than one window of {seq_len + 1}"
            )
        self.data = data
        self.seq_len = seq_len
        self.seed = seed
        self.position = position
        self.num_windows = len(data) - seq_len - 1  # every byte offset starts a window
        self._epoch = -1
        self._order = torch.empty(0, dtype=torch.long)

    def _starts(self, index: int) -> int:
        epoch, offset = divmod(index, self.num_windows)
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = torch.randperm(self.num_windows, generator=gen)
            self._epoch = epoch
        return int(self._order[offset])

    def next_batch(self, rank: int, world_size: int, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's ``(x, y)`` of shape (micro_batch, seq_len) for the next step; y is x shifted by one."""
        first = self.position + rank * micro_batch
        rows = [self._window(first + i) for i in range(micro_batch)]
        self.position += world_size * micro_batch
        batch = torch.stack(rows).long()  # (B, T + 1)
        return batch[:, :-1], batch[:, 1:]

    def _window(self, index: int) -> torch.Tensor:
        start = self._starts(index)
        return self.data[start : start + self.seq_len + 1]


def eval_windows(data: torch.Tensor, seq_len: int, count: int) -> torch.Tensor:
    """``count`` evenly spaced (seq_len + 1)-byte windows of ``data``: the same validation set every time."""
    span = len(data) - seq_len - 1
    if span <= 0:
        raise ValueError(
            f"the validation text ({len(data)} bytes) is shorter than one window of {seq_len + 1}"
        )
    starts = torch.linspace(0, span, count).long().tolist()
    return torch.stack([data[s : s + seq_len + 1] for s in starts]).long()  # (count, T + 1)
