"""The training dataloader initialize() builds when given ``training_data``, and ``RepeatingLoader``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
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


class RepeatingLoader:
    """DeepSpeed's ``RepeatingLoader``: iterate ``loader`` forever, starting it again when it ends.

    As in DeepSpeed, a new pass is just ``iter(loader)`` again: a ``DistributedSampler``'s epoch is not
    advanced, so a shuffled loader repeats the same order unless the script calls ``set_epoch`` itself.
    """

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.data_iter: Iterator[Any] = iter(loader)

    def __iter__(self) -> RepeatingLoader:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)  # an empty loader ends here, with StopIteration
