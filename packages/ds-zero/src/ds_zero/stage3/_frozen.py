"""Frozen parameters partitioned: each rank stores only its piece of every frozen (``requires_grad=False``)
parameter, as DeepSpeed partitions them like any other parameter.

Each frozen parameter of the model is cut on its own into ``dp`` equal chunks (padded with zeros; the chunk
is rounded up to a multiple of 4 elements, see below); a rank keeps only the payload of its chunk, one of
two encodings (``quantized``):

* plain (the default): the chunk's values in the parameter's own dtype, gathered exactly;
* int8 (``zero_quantized_nontrainable_weights``, DeepSpeed's ZeRO++ key): the chunk's int8 values
  (``_quant``: symmetric, one fp32 scale per block of ``WEIGHT_BLOCK`` elements), about one byte per
  element it owns, a quarter of fp32's four and half of bf16's two; every rank, the owner too, computes
  with the dequantized values, cast to the parameter's dtype.

The full values are gone once the payload is made. A gather is one all-gather of the payloads (as bytes)
of every frozen parameter it makes whole: the values in their dtype, or the int8 values and their scales
as DeepSpeed all-gathers them. Nothing trains these parameters, so the payload only changes when a full
value is written back (``GatheredParameters`` with a modifier, a checkpoint load): the rank's chunk is
encoded again.

The payload is a byte tensor; a chunk of a multiple of 4 elements keeps every payload a multiple of 4
bytes, so the int8 scales (after the values) start on a 4-byte boundary. The parameter's ``ds_tensor`` is
a view of the payload: the values in the parameter's dtype, or the int8 values carrying the fp32 scales
as ``ds_tensor.ds_quant_scale``, as DeepSpeed's quantized partitions do.
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
    """One frozen parameter's partition on this rank (see the module docstring)."""

    numel: int  # elements of the whole parameter
    chunk: int  # elements per rank (padding included; a multiple of 4)
    rank: int
    dtype: torch.dtype  # the parameter's
    quantized: bool  # int8 payload (``zero_quantized_nontrainable_weights``), else the values in ``dtype``
    payload: torch.Tensor  # uint8: the chunk's values in ``dtype``, or its int8 values then its fp32 scales

    @classmethod
    def cut(
        cls, full: torch.Tensor, dp: int, rank: int, device: torch.device, *, quantized: bool
    ) -> FrozenPart:
        """This rank's part of the flat value ``full`` (any float dtype: the parameter's)."""
        numel = full.numel()
        chunk = -(-max(-(-numel // dp), 1) // 4) * 4
        empty = torch.empty(0, dtype=torch.uint8, device=device)
        part = cls(numel, chunk, rank, full.dtype, quantized, empty)
        part.write(full)
        return part

    def write(self, full: torch.Tensor) -> None:
        """Encode this rank's chunk of the flat value ``full`` into the payload."""
        dtype = torch.float32 if self.quantized else self.dtype
        piece = torch.zeros(self.chunk, dtype=dtype, device=self.payload.device)
        lo, hi = min(self.rank * self.chunk, self.numel), min((self.rank + 1) * self.chunk, self.numel)
        piece[: hi - lo].copy_(full.reshape(-1)[lo:hi])
        payload = quantize(piece, WEIGHT_BITS, WEIGHT_BLOCK) if self.quantized else piece.view(torch.uint8)
        if self.payload.numel():  # in place: ``ds_tensor`` is a view of it
            self.payload.copy_(payload)
        else:
            self.payload = payload

    @property
    def values(self) -> torch.Tensor:
        """The chunk's values (a view of the payload): in the parameter's dtype, or int8 with the fp32 scales
        as ``.ds_quant_scale``."""
        if not self.quantized:
            return self.payload.view(self.dtype)
        values = self.payload[: self.chunk].view(torch.int8)
        values.ds_quant_scale = self.payload[self.chunk :].view(torch.float32)
        return values

    def unpack_into(self, out: torch.Tensor, payload: torch.Tensor, rank: int) -> None:
        """Write rank ``rank``'s chunk, given as its ``payload``, into the flat whole value ``out``."""
        lo, hi = min(rank * self.chunk, self.numel), min((rank + 1) * self.chunk, self.numel)
        if lo >= hi:
            return
        if self.quantized:
            out[lo:hi].copy_(dequantize(payload, self.chunk, WEIGHT_BITS, WEIGHT_BLOCK)[: hi - lo])
            return
        size = torch.empty(0, dtype=self.dtype).element_size()
        if payload.storage_offset() % size:  # a slice of a received buffer, not aligned for the dtype
            payload = payload.clone()
        out[lo:hi].copy_(payload.view(self.dtype)[: hi - lo])


def launch_frozen_gather(
    parts: Sequence[FrozenPart], outs: Sequence[torch.Tensor], group: ProcessGroup | None, dp: int
) -> list:
    """Fill each flat ``outs[i]`` with the whole value of ``parts[i]`` (dequantized when int8): one all-gather
    of the concatenated payloads (every rank's are the same size); returns the works to wait for."""
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
