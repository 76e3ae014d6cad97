"""Frozen parameters stored as int8 (``zero_quantized_nontrainable_weights``, DeepSpeed's ZeRO++ key).

Each frozen (``requires_grad=False``) parameter of the model is cut on its own into ``dp`` equal chunks
(padded with zeros); a rank keeps only the int8 payload of its chunk (``_quant``: symmetric, one fp32 scale
per block of ``WEIGHT_BLOCK`` elements): about one byte per element it owns, a quarter of fp32's four and
half of bf16's two. The full-precision values are gone once the payload is made. A gather is one
all-gather of the payloads of every frozen parameter it makes whole (int8 on the wire, as DeepSpeed
all-gathers the int8 partition and its scales), and every rank, the owner too, computes with the
dequantized values, cast to the parameter's dtype. Nothing trains these parameters, so the payload only
changes when a full value is written back (``GatheredParameters`` with a modifier, a checkpoint load): the
rank's chunk is quantized again.

The chunk is rounded up to a multiple of 4 elements so that the scales (after the values in the payload)
start on a 4-byte boundary: the parameter's ``ds_tensor`` is the int8 view of the values and carries the
fp32 scales as ``ds_tensor.ds_quant_scale``, as DeepSpeed's quantized partitions do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .._comm import ProcessGroup
from ._quant import WEIGHT_BITS, WEIGHT_BLOCK, dequantize, quantize
from ._zeropp import _Then

__all__ = ["FrozenPart", "launch_frozen_gather"]


@dataclass(eq=False)
class FrozenPart:
    """One frozen parameter's int8 partition on this rank."""

    numel: int  # elements of the whole parameter
    chunk: int  # elements per rank (padding included; a multiple of 4)
    rank: int
    payload: torch.Tensor  # uint8: the chunk's int8 values, then one fp32 scale per block

    @classmethod
    def cut(cls, full: torch.Tensor, dp: int, rank: int, device: torch.device) -> FrozenPart:
        """This rank's part of the flat value ``full`` (any float dtype), quantized."""
        numel = full.numel()
        chunk = -(-max(-(-numel // dp), 1) // 4) * 4
        part = cls(numel, chunk, rank, torch.empty(0, dtype=torch.uint8, device=device))
        part.write(full)
        return part

    def write(self, full: torch.Tensor) -> None:
        """Quantize this rank's chunk of the flat value ``full`` into the payload."""
        piece = torch.zeros(self.chunk, dtype=torch.float32, device=self.payload.device)
        lo, hi = min(self.rank * self.chunk, self.numel), min((self.rank + 1) * self.chunk, self.numel)
        piece[: hi - lo].copy_(full.reshape(-1)[lo:hi])
        payload = quantize(piece, WEIGHT_BITS, WEIGHT_BLOCK)
        if self.payload.numel():  # in place: ``ds_tensor`` is a view of it
            self.payload.copy_(payload)
        else:
            self.payload = payload

    @property
    def values(self) -> torch.Tensor:
        """The int8 values (a view of the payload), with the fp32 scales as ``.ds_quant_scale``."""
        values = self.payload[: self.chunk].view(torch.int8)
        values.ds_quant_scale = self.payload[self.chunk :].view(torch.float32)
        return values

    def unpack_into(self, out: torch.Tensor, payload: torch.Tensor, rank: int) -> None:
        """Write rank ``rank``'s chunk, given as its ``payload``, into the flat whole value ``out``."""
        lo, hi = min(rank * self.chunk, self.numel), min((rank + 1) * self.chunk, self.numel)
        if lo < hi:
            out[lo:hi].copy_(dequantize(payload, self.chunk, WEIGHT_BITS, WEIGHT_BLOCK)[: hi - lo])


def launch_frozen_gather(
    parts: Sequence[FrozenPart], outs: Sequence[torch.Tensor], group: ProcessGroup | None, dp: int
) -> list:
    """Fill each flat ``outs[i]`` with the dequantized whole value of ``parts[i]``: one all-gather of the
    concatenated payloads (every rank's are the same size); returns the works to wait for."""
    if dp == 1:
        for part, out in zip(parts, outs):
            part.unpack_into(out, part.payload, 0)
        return []
    send = torch.cat([p.payload for p in parts]) if len(parts) > 1 else parts[0].payload
    recv = [torch.empty_like(send) for _ in range(dp)]
    work = dist.all_gather(recv, send, group=group, async_op=True)

    def unpack() -> None:
        for r, got in enumerate(recv):
            pos = 0
            for part, out in zip(parts, outs):
                n = part.payload.numel()
                part.unpack_into(out, got[pos : pos + n], r)
                pos += n

    return [_Then([work], unpack)]
