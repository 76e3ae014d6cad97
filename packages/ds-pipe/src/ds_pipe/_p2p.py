"""Activations and gradients between neighbouring stages: a header, then the tensors, point to point.

Every message carries its own header (status, then each tensor's dtype, requires_grad and shape), so the
receiver allocates exactly what arrives, and a sender that fails says so to its neighbour instead of
leaving it waiting: the receiver raises, naming the stage that failed. A neighbour that hangs (alive, so it
can say nothing) is bounded by ``timeout``: each send and receive waits at most that long, then raises
the backend's timeout error (the runner names the stage).
"""

from __future__ import annotations

from datetime import timedelta
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


def _send(t: torch.Tensor, dst: int, group: Any, timeout: timedelta | None) -> None:
    if timeout is None:  # the group's own timeout
        dist.send(t, dst=dst, group=group)
    else:
        dist.isend(t, dst=dst, group=group).wait(timeout)


def _recv(t: torch.Tensor, src: int, group: Any, timeout: timedelta | None) -> None:
    if timeout is None:
        dist.recv(t, src=src, group=group)
    else:
        dist.irecv(t, src=src, group=group).wait(timeout)


def send_tensors(
    tensors: tuple[torch.Tensor, ...], dst: int, group: Any, timeout: timedelta | None = None
) -> None:
    """Send a header and ``tensors`` to ``dst``; each message waits at most ``timeout`` (None: the group's)."""
    meta = _meta(tensors)
    _send(torch.tensor([_OK, len(meta)], dtype=torch.int64), dst, group, timeout)
    _send(torch.tensor(meta, dtype=torch.int64), dst, group, timeout)
    for t in tensors:
        _send(t.detach().contiguous(), dst, group, timeout)


def send_failure(dst: int, group: Any) -> Any:
    """Tell a neighbour that may be waiting on this stage that it will get nothing (best effort, not
    waited for: the neighbour may be sending to this stage itself, or gone)."""
    try:
        return dist.isend(torch.tensor([_FAILED, 0], dtype=torch.int64), dst=dst, group=group)
    except Exception:  # noqa: BLE001 - the original error is what matters
        return None


def recv_tensors(
    src: int, group: Any, device: torch.device, timeout: timedelta | None = None
) -> tuple[tuple[torch.Tensor, ...], list[bool]]:
    """The tensors sent by ``src`` and, per tensor, whether it required grad on the sender; each message
    waits at most ``timeout`` (None: the group's)."""
    header = torch.empty(_HEADER_LEN, dtype=torch.int64)
    _recv(header, src, group, timeout)
    if int(header[0]) != _OK:
        raise PeerFailed(f"rank {src} failed before sending")
    meta = torch.empty(int(header[1]), dtype=torch.int64)
    _recv(meta, src, group, timeout)
    m = meta.tolist()
    out, grads, pos = [], [], 1
    for _ in range(m[0]):
        dtype, rg, ndim = _DTYPES[m[pos]], bool(m[pos + 1]), m[pos + 2]
        shape = m[pos + 3 : pos + 3 + ndim]
        pos += 3 + ndim
        t = torch.empty(shape, dtype=dtype)
        _recv(t, src, group, timeout)
        out.append(t.to(device))
        grads.append(rg)
    return tuple(out), grads
