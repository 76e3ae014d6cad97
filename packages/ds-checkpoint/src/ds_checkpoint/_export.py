"""Consolidated fp32 weights from a checkpoint, streamed one tensor at a time into a safetensors file."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

from ._errors import CheckpointNotFoundError
from ._format import DTYPE_NAMES, META_FILE
from ._load import LoadedState, load_state


def _open(ckpt: str | os.PathLike, tag: str | None) -> LoadedState:
    ckpt = Path(ckpt)
    if tag is None and (ckpt / META_FILE).is_file():  # a tag directory itself
        ckpt, tag = ckpt.parent, ckpt.name
    state = load_state(ckpt, tag, load_model=False)
    if state is None:
        raise CheckpointNotFoundError(f"{ckpt / 'latest'} does not exist: pass --tag")
    return state


def _plan(state: LoadedState) -> list[tuple[str, list[int], torch.dtype, tuple]]:
    """(name, shape, dtype, source) per output tensor; parameters from the fp32 master shards (an MoE
    model's experts under their global expert index), the rest from the weight files."""
    plan = []
    covered = set()
    for g, group in enumerate(state.optimizer_groups):
        if "master" not in state.meta["optimizer"]["tensors"]:
            break
        for p in group["params"]:
            numel = torch.Size(p["shape"]).numel()
            plan.append((p["name"], p["shape"], torch.float32, ("master", g, p["offset"], numel)))
            covered.add(p["name"])
    for name, file in state.model_index().items():  # model.safetensors and the per-expert files
        if name not in covered:  # buffers, frozen parameters, or no optimizer state at all
            dtype, shape = state.file(file).info(name)
            out_dtype = torch.float32 if dtype.is_floating_point else dtype
            plan.append((name, shape, out_dtype, ("model", file, name)))
    return plan


def _read(state: LoadedState, source: tuple) -> torch.Tensor:
    """One planned tensor, flat, as stored (master shards or the model file)."""
    if source[0] == "master":
        _, g, start, numel = source
        return state.read_shard(g, start, start + numel, states=("master",))["master"]
    return state.file(source[1]).tensor(source[2]).reshape(-1)


def fp32_state_dict(ckpt: str | os.PathLike, tag: str | None = None) -> dict[str, torch.Tensor]:
    """The consolidated fp32 weights of a checkpoint as a state dict in memory (what :func:`export_fp32`
    writes to a file): parameters from the fp32 master shards, buffers and the rest from the model file."""
    state = _open(ckpt, tag)
    return {
        name: _read(state, source).to(dtype).reshape(shape) for name, shape, dtype, source in _plan(state)
    }


def export_fp32(ckpt: str | os.PathLike, out_path: str | os.PathLike, tag: str | None = None) -> list[str]:
    """Write the consolidated fp32 weights of a checkpoint to ``out_path`` (safetensors).

    ``ckpt`` is a save directory (``tag`` or ``latest`` picks the checkpoint) or a tag directory.
    Parameters come from the fp32 master shards, mapped to names and shapes through the saved
    group metadata; everything else (buffers, frozen parameters) from the model file, floating
    point converted to fp32. One tensor is in memory at a time. Returns the names written.
    """
    state = _open(ckpt, tag)
    plan = _plan(state)
    header: dict = {}
    offset = 0
    for name, shape, dtype, _ in plan:
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        header[name] = {
            "dtype": DTYPE_NAMES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header["__metadata__"] = {"format": "pt", "source": str(state.path)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8-byte alignment
    out_path = Path(out_path)
    tmp = out_path.with_name(out_path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, _, dtype, source in plan:
            tensor = _read(state, source)
            f.write(tensor.to(dtype).contiguous().view(torch.uint8).numpy().tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out_path)
    return [name for name, *_ in plan]
