"""The training dataloader initialize() builds when given ``training_data``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def build_dataloader(
    dataset: Dataset,
    *,
    micro_batch_size: int,
    rank: int,
    world_size: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    drop_last: bool = False,
    seed: int = 0,
) -> DataLoader:
    """A loader of micro-batches: each rank sees its own 1/world_size of the data (DistributedSampler)."""
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=drop_last
    )
    return DataLoader(
        dataset,
        batch_size=micro_batch_size,
        sampler=sampler,
        collate_fn=collate_fn,
        drop_last=drop_last,
        pin_memory=torch.cuda.is_available(),
    )
