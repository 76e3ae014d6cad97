"""Memory as measured inside a training process: live tensor storages and peak RSS.

Used by tools/bench/bench_training.py identically for every implementation (ds, DDP, FSDP2, DeepSpeed), so it
imports nothing but torch and the standard library: the same file runs in the DeepSpeed venv.
Nothing here knows any engine's layout; a figure from here is never derived from a formula.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import torch
from torch import nn


def _candidate_tensors() -> Iterator[torch.Tensor]:
    """Every tensor reachable from Python: gc's tracked objects, plus the grads and buffers of every
    module (a ``.grad`` lives in C++ and has no Python object until someone reads it)."""
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: that reads __class__, which warns on torch's deprecated aliases
        if issubclass(kind, torch.Tensor):
            yield obj
        elif issubclass(kind, nn.Module):
            for p in obj.parameters(recurse=False):
                if p.grad is not None:
                    yield p.grad
            yield from obj.buffers(recurse=False)
        elif issubclass(kind, torch.optim.Optimizer):
            for state in obj.state.values():
                yield from (v for v in state.values() if isinstance(v, torch.Tensor))


def _storages(t: torch.Tensor) -> Iterator[tuple[tuple[str, int], int]]:
    """(key, nbytes) of the storages behind ``t``; wrapper tensors (DTensor, sparse) yield their parts."""
    local = getattr(t, "_local_tensor", None)  # DTensor: the shard is the real storage
    if isinstance(local, torch.Tensor):
        yield from _storages(local)
        return
    if t.is_sparse:
        yield from _storages(t._indices())
        yield from _storages(t._values())
        return
    if t.device.type == "meta":
        return
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # a wrapper subclass without its own storage
        return
    if storage.data_ptr() != 0 and storage.nbytes() > 0:
        yield (str(t.device), storage.data_ptr()), storage.nbytes()


def live_tensor_bytes() -> int:
    """Bytes of every distinct tensor storage alive in this process (deduplicated by data pointer, so a
    view and its base, or a parameter and the flat buffer it points into, count once)."""
    gc.collect()
    seen: dict[tuple[str, int], int] = {}
    for t in _candidate_tensors():
        for key, nbytes in _storages(t):
            seen[key] = max(nbytes, seen.get(key, 0))
    return sum(seen.values())


def reset_peak_rss() -> None:
    """Restart the kernel's resident-set high-water mark of this process (Linux ``clear_refs`` 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"no {field} in /proc/self/status: RSS figures need Linux")


def peak_rss_bytes() -> int:
    """The resident-set high-water mark (VmHWM) since the last :func:`reset_peak_rss`."""
    return _status_bytes("VmHWM")


def current_rss_bytes() -> int:
    """The resident set now (VmRSS)."""
    return _status_bytes("VmRSS")


def _holder(t: torch.Tensor) -> str:
    """Where ``t`` is referenced from, as ``Type.attr`` / ``Type[key]`` (first few referrers), for tracing."""
    names = []
    for ref in gc.get_referrers(t):
        if isinstance(ref, dict):
            key = next((k for k, v in ref.items() if v is t), "?")
            owners = [o for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref]
            where = type(owners[0]).__name__ + "." if owners else "dict["
            names.append(f"{where}{key}" + ("" if owners else "]"))
        elif isinstance(ref, list | tuple):
            names.append(type(ref).__name__)
        elif not isinstance(ref, type(gc.get_objects)) and type(ref).__name__ != "frame":
            names.append(type(ref).__name__)
    return ", ".join(sorted(set(names))[:4]) or "(no Python referrer: a .grad or a module buffer)"


def live_tensor_table(min_bytes: int = 1 << 16) -> list[tuple[int, str]]:
    """Every distinct live storage of at least ``min_bytes``, largest first, as ``(nbytes, description)``
    with the dtype and shape of the largest tensor on it and who refers to it: what to read when
    :func:`live_tensor_bytes` is larger than expected."""
    gc.collect()
    best: dict[tuple[str, int], tuple[int, torch.Tensor]] = {}
    for t in _candidate_tensors():
        for key, nbytes in _storages(t):
            if nbytes >= min_bytes and (key not in best or t.numel() > best[key][1].numel()):
                best[key] = (nbytes, t)
    rows = [
        (n, f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)} {t.device.type}: {_holder(t)}")
        for n, t in best.values()
    ]
    del best
    return sorted(rows, key=lambda r: -r[0])
