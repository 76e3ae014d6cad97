"""Splitting saved activations across the model-parallel group, and the contiguous buffer pool."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._errors import CheckpointBuffersExhaustedError


def partition_numel(numel: int, mp_size: int) -> int:
    """Elements each rank stores: ceil(numel / mp_size); the last ranks' slices are zero-padded."""
    return -(-numel // mp_size)


def take_partition(tensor: torch.Tensor, mp_rank: int, mp_size: int) -> torch.Tensor:
    """A new 1-D tensor holding this rank's slice ``[rank*p, (rank+1)*p)`` of the flattened tensor.

    Padding (instead of DeepSpeed's divisibility assert) lets any shape be partitioned; the pad
    never leaves this module because ``gather_full`` trims it.
    """
    flat = tensor.detach().reshape(-1)
    part_numel = partition_numel(flat.numel(), mp_size)
    start = min(mp_rank * part_numel, flat.numel())
    valid = min(part_numel, flat.numel() - start)
    part = flat.new_empty(part_numel)
    part[:valid].copy_(flat[start : start + valid])
    part[valid:].zero_()
    return part


def gather_full(
    part: torch.Tensor, shape: torch.Size, mp_size: int, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Rebuild the original tensor from every rank's partition with one ``all_gather``."""
    if mp_size == 1:
        return part[: shape.numel()].view(shape)
    full = part.new_empty(part.numel() * mp_size)
    dist.all_gather(list(full.chunk(mp_size)), part.contiguous(), group=group)
    return full[: shape.numel()].view(shape)


class ContiguousBufferPool:
    """``number_checkpoints`` preallocated slots per checkpointed-argument position.

    Each ``checkpoint()`` call copies its saved partitions into the next slot, so saved activations
    sit in one block per position instead of fragmenting the allocator. Slots are released (and
    reallocated lazily) at the first backward, as in DeepSpeed.
    """

    def __init__(self, number_checkpoints: int, device: torch.device | None) -> None:
        self.number_checkpoints = number_checkpoints
        self._device = device  # None: keep each partition's own device
        self._buffers: dict[int, torch.Tensor] = {}  # position -> (number_checkpoints, partition numel)
        self._used: dict[int, int] = {}

    def store(self, position: int, part: torch.Tensor) -> torch.Tensor:
        """Copy ``part`` into the next free slot for argument ``position``; return the slot view."""
        buffer = self._buffers.get(position)
        if buffer is None:
            device = self._device if self._device is not None else part.device
            buffer = torch.empty((self.number_checkpoints, part.numel()), dtype=part.dtype, device=device)
            self._buffers[position] = buffer
            self._used[position] = 0
        if buffer.shape[1] != part.numel() or buffer.dtype != part.dtype:
            raise ValueError(
                "contiguous_memory_optimization needs every checkpoint() call to pass tensors of the same "
                f"size and dtype at each position: argument {position} has {part.numel()} elements of "
                f"{part.dtype} per rank, the buffer was made for {buffer.shape[1]} of {buffer.dtype}. "
                "Set activation_checkpointing.contiguous_memory_optimization to false for such models"
            )
        slot = self._used[position]
        if slot >= self.number_checkpoints:
            raise CheckpointBuffersExhaustedError(
                f"activation checkpointing ran out of contiguous buffers: number_checkpoints="
                f"{self.number_checkpoints}, but checkpoint() was called more often than that since the "
                "last backward. Set activation_checkpointing.number_checkpoints (configure(num_checkpoints=...)) "
                "to at least the number of checkpoint() calls in one forward pass, or call "
                "ds_checkpoint.activation.reset() after a forward pass that has no backward"
            )
        self._used[position] = slot + 1
        view = buffer[slot]
        view.copy_(part)
        return view

    def release(self) -> None:
        """Drop the pool's references; slots still saved by a pending backward stay alive until used."""
        self._buffers = {}
        self._used = {}
