"""The on-disk format: file names, atomic writes, and block-verified reads of safetensors files.

Every file except ``meta.json`` is listed in ``meta.json["files"]`` with its size and the SHA-256 of
each ``block_bytes`` block. A reader checks the size (truncation) and the digest of every block it
touches (tampering), so a rank that reads a few slices hashes only the blocks under those slices.
``meta.json`` carries the SHA-256 of its own canonical content.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ._errors import CheckpointCorruptError, CheckpointNotFoundError

FORMAT = "ds-checkpoint/1"
SHARD_FORMAT = "ds-flat-shard/1"
META_FILE = "meta.json"
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.safetensors"  # tensors found inside client_state / scheduler / scaler state
LATEST_FILE = "latest"
BLOCK_BYTES = 1 << 20

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def optim_files(rank: int) -> tuple[str, str]:
    """(tensors, meta) file names of one rank's optimizer shard."""
    return f"optim_rank{rank:05d}.safetensors", f"optim_rank{rank:05d}.json"


def rng_file(rank: int) -> str:
    """File name of one rank's RNG states."""
    return f"rng_rank{rank:05d}.safetensors"


def expert_file(layer: int, expert: int) -> str:
    """File name of one expert's weights: MoE layer ``layer`` (the order of the MoE layers in the model),
    global expert index ``expert`` (DeepSpeed's ``layer_{i}_expert_{j}_mp_rank_00_model_states.pt``)."""
    return f"layer_{layer}_expert_{expert}.safetensors"


def check_model_file_name(name: str) -> None:
    """A weight file besides ``model.safetensors`` must be a plain ``*.safetensors`` name that no other file
    of the format uses."""
    reserved = name in (MODEL_FILE, STATE_FILE) or name.startswith(("optim_rank", "rng_rank"))
    if reserved or not name.endswith(".safetensors") or "/" in name or os.sep in name or name.startswith("."):
        raise ValueError(
            f"weight file name {name!r}: expected a plain '*.safetensors' name, not {MODEL_FILE!r}, "
            f"{STATE_FILE!r}, 'optim_rank*' or 'rng_rank*'"
        )


# ----------------------------------------------------------------------------------------- writing
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _file_entry(path: Path, block_bytes: int = BLOCK_BYTES) -> dict[str, Any]:
    blocks = []
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(block_bytes):
            blocks.append(hashlib.sha256(chunk).hexdigest())
            size += len(chunk)
    return {"bytes": size, "block_bytes": block_bytes, "blocks": blocks}


def _finish(tmp: Path, final: Path) -> dict[str, Any]:
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    entry = _file_entry(tmp)
    os.replace(tmp, final)
    return entry


def write_safetensors(
    path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> dict[str, Any]:
    """Write ``tensors`` to ``path`` via a temporary name; return the file's manifest entry."""
    seen: set[int] = set()
    plain = {}
    for name, tensor in tensors.items():
        t = tensor.detach().cpu().contiguous()
        # safetensors refuses tensors that share storage (tied weights): give each its own copy.
        if t.numel() and t.untyped_storage().data_ptr() in seen:
            t = t.clone()
        if t.numel():
            seen.add(t.untyped_storage().data_ptr())
        plain[name] = t
    tmp = path.with_name(path.name + ".tmp")
    save_file(plain, str(tmp), metadata=metadata)
    return _finish(tmp, path)


def write_json(path: Path, obj: Any) -> dict[str, Any]:
    """Write ``obj`` as JSON to ``path`` via a temporary name; return the file's manifest entry."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True, allow_nan=True))
    return _finish(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so a reader sees either the old or the new content."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def seal_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """Return ``meta`` with ``meta_sha256``: the digest of its canonical JSON without that key."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=True).encode()).hexdigest()
    return {**body, "meta_sha256": digest}


def read_meta(ckpt_dir: Path) -> dict[str, Any]:
    """Read and verify ``ckpt_dir/meta.json``."""
    path = ckpt_dir / META_FILE
    if not path.is_file():
        raise CheckpointNotFoundError(f"checkpoint metadata {path} does not exist")
    try:
        meta = json.loads(path.read_text())
        ok = isinstance(meta, dict) and seal_meta(meta)["meta_sha256"] == meta.get("meta_sha256")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointCorruptError(f"{path} is not valid JSON (truncated or tampered?): {e}") from None
    if not ok:
        raise CheckpointCorruptError(f"{path} does not match its own meta_sha256: the file was modified")
    if meta.get("format") != FORMAT:
        raise CheckpointCorruptError(f"{path} has format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


# ----------------------------------------------------------------------------------------- reading
class VerifiedFile:
    """A checkpoint file read in byte ranges, each block checked against the manifest once."""

    def __init__(self, path: Path, entry: dict[str, Any] | None) -> None:
        if entry is None:
            raise CheckpointCorruptError(f"{path} is not listed in {path.parent / META_FILE}")
        if not path.is_file():
            raise CheckpointNotFoundError(f"checkpoint file {path} does not exist")
        size = path.stat().st_size
        if size != entry["bytes"]:
            how = "truncated" if size < entry["bytes"] else "longer than saved"
            raise CheckpointCorruptError(f"{path} is {how}: {size} bytes, expected {entry['bytes']}")
        self.path = path
        self._entry = entry
        self._verified: set[int] = set()
        self._header: dict[str, Any] | None = None

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the file, after checking the digest of every block they touch."""
        if start >= end:
            return b""
        bb = self._entry["block_bytes"]
        first, last = start // bb, max(start, end - 1) // bb
        with open(self.path, "rb") as f:
            f.seek(first * bb)
            data = f.read((last - first + 1) * bb)
        for i in range(first, last + 1):
            if i in self._verified:
                continue
            block = data[(i - first) * bb : (i - first + 1) * bb]
            if hashlib.sha256(block).hexdigest() != self._entry["blocks"][i]:
                raise CheckpointCorruptError(
                    f"{self.path} was modified after it was saved: bytes [{i * bb}, {i * bb + len(block)}) "
                    "do not match the digest recorded in meta.json"
                )
            self._verified.add(i)
        return data[start - first * bb : end - first * bb]

    def read_all(self) -> bytes:
        """The whole file, verified."""
        return self.read(0, self._entry["bytes"])

    def header(self) -> dict[str, Any]:
        """The safetensors header: tensor name -> {dtype, shape, data_offsets}, plus __metadata__."""
        if self._header is None:
            (length,) = struct.unpack("<Q", self.read(0, 8))
            try:
                self._header = json.loads(self.read(8, 8 + length))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CheckpointCorruptError(f"{self.path}: unreadable safetensors header: {e}") from None
            self._data_start = 8 + length
        return self._header

    def names(self) -> list[str]:
        """Tensor names in the file."""
        return [k for k in self.header() if k != "__metadata__"]

    def info(self, name: str) -> tuple[torch.dtype, list[int]]:
        """(dtype, shape) of one tensor."""
        spec = self._spec(name)
        return DTYPES[spec["dtype"]], spec["shape"]

    def _spec(self, name: str) -> dict[str, Any]:
        header = self.header()
        if name not in header:
            raise CheckpointCorruptError(f"{self.path} has no tensor {name!r}")
        return header[name]

    def tensor_range(self, name: str, start: int, end: int) -> torch.Tensor:
        """Elements [start, end) of the flattened tensor ``name``, reading only their bytes."""
        spec = self._spec(name)
        dtype = DTYPES[spec["dtype"]]
        itemsize = torch.empty((), dtype=dtype).element_size()
        lo, hi = spec["data_offsets"]
        numel = (hi - lo) // itemsize
        if not 0 <= start <= end <= numel:
            raise CheckpointCorruptError(
                f"{self.path}: {name!r} has {numel} elements, [{start}, {end}) asked"
            )
        if start == end:
            return torch.empty(0, dtype=dtype)
        base = self._data_start + lo
        raw = bytearray(self.read(base + start * itemsize, base + end * itemsize))
        return torch.frombuffer(raw, dtype=dtype)

    def tensor(self, name: str) -> torch.Tensor:
        """The whole tensor ``name`` with its shape."""
        spec = self._spec(name)
        dtype = DTYPES[spec["dtype"]]
        numel = (spec["data_offsets"][1] - spec["data_offsets"][0]) // torch.empty(
            (), dtype=dtype
        ).element_size()
        return self.tensor_range(name, 0, numel).reshape(spec["shape"])

    def json(self) -> Any:
        """The file parsed as JSON."""
        return json.loads(self.read_all())
