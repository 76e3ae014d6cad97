"""Activations and gradients between neighbouring stages: a header, then the tensors, point to point.

Every message carries its own header (status, then each tensor's dtype, requires_grad and shape), so the
receiver allocates exactly what arrives, and a sender that fails says so to its neighbour instead of
leaving it waiting: the receiver raises, naming the stage that failed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["PeerFailed", "recv_tensors", "send_failure", "send_tensors"]

_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]
_OK, _FAILED = 0, 1
_HEADER_LEN = 2  # [status, length of the meta that follows]


class PeerFailed(RuntimeError):
    """The neighbouring stage failed and said so instead of sending."""


def _meta(tensors: tuple[torch.Tensor, ...]) -> list[int]:
    meta = [len(tensors)]
    for t in tensors:
        if t.dtype not in _DTYPES:
            raise TypeError(f"cannot send a {t.dtype} tensor between pipeline stages (supported: {_DTYPES})")
        meta += [_DTYPES.index(t.dtype), int(t.requires_grad), t.dim(), *t.shape]
    return meta


def send_tensors(tensors: tuple[torch.Tensor, ...], dst: int, group: Any) -> None:
    meta = _meta(tensors)
    dist.send(torch.tensor([_OK, len(meta)], dtype=torch.int64), dst=dst, group=group)
    dist.send(torch.tensor(meta, dtype=torch.int64), dst=dst, group=group)
    for t in tensors:
        dist.send(t.detach().contiguous(), dst=dst, group=group)


def send_failure(dst: int, group: Any) -> Any:
    """Tell a neighbour that may be waiting on this stage that it will get nothing (best effort, not
    waited for: the neighbour may be sending to this stage itself, or gone)."""
    try:
        return dist.isend(torch.tensor([_FAILED, 0], dtype=torch.int64), dst=dst, group=group)
    except Exception:  # noqa: BLE001 - the original error is what matters
        return None


def recv_tensors(src: int, group: Any, device: torch.device) -> tuple[tuple[torch.Tensor, ...], list[bool]]:
    """The tensors sent by ``src`` and, per tensor, whether it required grad on the sender."""
    header = torch.empty(_HEADER_LEN, dtype=torch.int64)
    dist.recv(header, src=src, group=group)
    if int(header[0]) != _OK:
        raise PeerFailed(f"rank {src} failed before sending")
    meta = torch.empty(int(header[1]), dtype=torch.int64)
    dist.recv(meta, src=src, group=group)
    m = meta.tolist()
    out, grads, pos = [], [], 1
    for _ in range(m[0]):
        dtype, rg, ndim = _DTYPES[m[pos]], bool(m[pos + 1]), m[pos + 2]
        shape = m[pos + 3 : pos + 3 + ndim]
        pos += 3 + ndim
        t = torch.empty(shape, dtype=dtype)
        dist.recv(t, src=src, group=group)
        out.append(t.to(device))
        grads.append(rg)
    return tuple(out), grads
