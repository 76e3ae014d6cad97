"""Blockwise symmetric quantization for ZeRO++'s wire formats (qwZ: int8 weights, qgZ: 4-bit gradients).

A flat tensor of ``n`` elements is cut into blocks of ``block`` elements (the last one may be short); each
block is scaled by its largest magnitude so that it maps onto the integers ``[-qmax, qmax]``
(``qmax = 2**(bits-1) - 1``: 127 for 8 bits, 7 for 4 bits) and rounded to the nearest. The payload is one
``uint8`` tensor: the values (one byte each at 8 bits, two to a byte at 4 bits), then one fp32 scale per
block as 4 bytes. Its size depends on ``n`` only (``payload_bytes``), so a receiver knows what to expect.
This is DeepSpeed's ZeRO++ scheme (symmetric, per-group fp32 scales; 8 bits on the weight all-gather,
4 bits on the gradient all-to-alls), written with torch ops.
"""

from __future__ import annotations

import torch

__all__ = [
    "GRAD_BITS",
    "GRAD_BLOCK",
    "WEIGHT_BITS",
    "WEIGHT_BLOCK",
    "dequantize",
    "payload_bytes",
    "quantize",
]

WEIGHT_BITS, WEIGHT_BLOCK = 8, 2048  # DeepSpeed: int8, groups of at most 8000 elements (4k preferred)
GRAD_BITS, GRAD_BLOCK = 4, 512  # DeepSpeed: int4, one group per row of a gradient's partition


def _blocks(n: int, block: int) -> int:
    return -(-n // block)


def _value_bytes(n: int, bits: int) -> int:
    return n if bits == 8 else -(-n // 2)


def payload_bytes(n: int, bits: int, block: int) -> int:
    """Bytes of the payload of ``n`` elements."""
    return _value_bytes(n, bits) + 4 * _blocks(n, block) if n else 0


def quantize(x: torch.Tensor, bits: int, block: int) -> torch.Tensor:
    """The ``uint8`` payload of the flat tensor ``x`` (any float dtype; quantized from its fp32 values)."""
    n = x.numel()
    if n == 0:
        return torch.empty(0, dtype=torch.uint8, device=x.device)
    nb = _blocks(n, block)
    padded = torch.zeros(nb * block, dtype=torch.float32, device=x.device)
    padded[:n].copy_(x.reshape(-1))
    blocks = padded.view(nb, block)
    qmax = (1 << (bits - 1)) - 1
    scale = blocks.abs().amax(dim=1) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(blocks / scale[:, None]).clamp_(-qmax, qmax).to(torch.int8).view(-1)
    if bits == 8:
        values = q[:n].view(torch.uint8)
    else:  # two 4-bit values to a byte, offset by 8 (0..15)
        u = (q[: 2 * _value_bytes(n, 4)] + 8).to(torch.uint8).view(-1, 2)
        values = u[:, 0] | (u[:, 1] << 4)
    return torch.cat([values, scale.view(torch.uint8)])


def dequantize(payload: torch.Tensor, n: int, bits: int, block: int) -> torch.Tensor:
    """The fp32 values of ``n`` elements from a payload made by ``quantize``."""
    if n == 0:
        return torch.empty(0, dtype=torch.float32, device=payload.device)
    nb, vb = _blocks(n, block), _value_bytes(n, bits)
    scale = payload[vb : vb + 4 * nb].clone().view(torch.float32)
    values = payload[:vb]
    if bits == 8:
        q = values.view(torch.int8).to(torch.float32)
    else:
        q = torch.stack([values & 15, values >> 4], dim=1).view(-1)[:n].to(torch.float32) - 8
    padded = torch.zeros(nb * block, dtype=torch.float32, device=payload.device)
    padded[:n] = q
    return (padded.view(nb, block) * scale[:, None]).view(-1)[:n]
