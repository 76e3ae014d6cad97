"""Loading: resolve the tag, verify files, and cut optimizer shards for any new partitioning."""

from __future__ import annotations

import json
import os
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ._errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointTagNotFoundError,
)
from ._format import (
    LATEST_FILE,
    MODEL_FILE,
    SHARD_FORMAT,
    STATE_FILE,
    VerifiedFile,
    optim_files,
    read_meta,
    rng_file,
)


def decode(value: Any, tensors: Callable[[str], torch.Tensor]) -> Any:
    """Inverse of the save-side ``encode``: rebuild tuples and fetch referenced tensors."""
    if isinstance(value, list):
        return [decode(v, tensors) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__tensor__"}:
            return tensors(value["__tensor__"])
        if set(value) == {"__tuple__"}:
            return tuple(decode(v, tensors) for v in value["__tuple__"])
        return {k: decode(v, tensors) for k, v in value.items()}
    return value


def resolve_checkpoint(load_dir: str | os.PathLike, tag: str | None = None) -> Path | None:
    """The checkpoint directory for ``tag``, or for the tag in ``load_dir/latest`` when ``tag`` is None.

    Returns None (with a warning, as DeepSpeed does) when ``tag`` is None and there is no ``latest``.
    Raises ``CheckpointTagNotFoundError`` (a ``CheckpointNotFoundError`` and, as DeepSpeed's, an
    ``AssertionError``) when the chosen tag directory does not exist.
    """
    load_dir = Path(load_dir)
    if tag is None:
        latest = load_dir / LATEST_FILE
        if not latest.is_file():
            warnings.warn(
                f"Unable to find latest file at {latest}, if trying to load latest checkpoint please "
                "pass an explicit tag or save a checkpoint first.",
                stacklevel=2,
            )
            return None
        tag = latest.read_text().strip()
    path = load_dir / str(tag)
    if path.is_dir():
        return path
    previous = load_dir / f".{tag}.old"
    if previous.is_dir():
        # a re-save of this tag was killed between its two renames: the old copy is complete
        warnings.warn(
            f"checkpoint directory {path} is missing; loading {previous}, the complete earlier save of "
            f"tag {tag!r} (a save over it was interrupted). The next save into {load_dir} moves it back.",
            stacklevel=2,
        )
        return previous
    raise CheckpointTagNotFoundError(f"checkpoint directory {path} does not exist")


def covering_pieces(
    shards: Sequence[tuple[int, int, int]], start: int, end: int, what: str
) -> list[tuple[int, int, int]]:
    """Pieces ``(owner, lo, hi)`` of saved shards ``(owner, s, e)`` that tile [start, end) in order.

    Overlapping shards are allowed (the first one that covers a position wins); a gap raises
    ``CheckpointCorruptError`` naming ``what``.
    """
    pieces = []
    cursor = start
    for owner, s, e in sorted(shards, key=lambda x: (x[1], x[0])):
        if cursor >= end:
            break
        if s <= cursor < e:
            hi = min(e, end)
            pieces.append((owner, cursor, hi))
            cursor = hi
    if cursor < end:
        raise CheckpointCorruptError(f"{what}: no saved shard holds elements [{cursor}, {end})")
    return pieces


def new_shard_meta(
    groups: list[dict[str, Any]],
    extra: dict[str, Any],
    shards: Sequence[tuple[int, int]],
    rank: int,
    world_size: int,
) -> dict[str, Any]:
    """A ``ds-flat-shard/1`` meta for a new partitioning ``shards`` (one [start, end) per group)."""
    if len(shards) != len(groups):
        raise ValueError(f"{len(shards)} shard ranges given, the checkpoint has {len(groups)} groups")
    return {
        "format": SHARD_FORMAT,
        "world_size": world_size,
        "rank": rank,
        "groups": [{**g, "shard": [int(s), int(e)]} for g, (s, e) in zip(groups, shards, strict=True)],
        "extra": extra,
    }


@dataclass
class LoadedState:
    """A checkpoint opened for loading. Optimizer slices are read on demand by ``read_shard``."""

    path: Path
    tag: str
    world_size: int
    model_state: dict[str, torch.Tensor] | None
    lr_scheduler: dict[str, Any] | None
    loss_scaler: dict[str, Any] | None
    counters: dict[str, Any]
    client_state: dict[str, Any]
    config: dict[str, Any] | None
    meta: dict[str, Any] = field(repr=False)
    _files: dict[str, VerifiedFile] = field(default_factory=dict, repr=False)

    def file(self, name: str) -> VerifiedFile:
        """One file of the checkpoint, opened for verified reading (cached)."""
        if name not in self._files:
            self._files[name] = VerifiedFile(self.path / name, self.meta["files"].get(name))
        return self._files[name]

    @property
    def model_files(self) -> list[str]:
        """The files holding the model's weights: ``model.safetensors`` and any per-expert files."""
        if "model_files" in self.meta:
            return list(self.meta["model_files"])
        return [MODEL_FILE] if MODEL_FILE in self.meta["files"] else []

    def model_index(self) -> dict[str, str]:
        """Every saved weight's name -> the file holding it (reads only the files' headers)."""
        index: dict[str, str] = {}
        for name in self.model_files:
            for tensor in self.file(name).names():
                if tensor in index:
                    raise CheckpointCorruptError(
                        f"{self.path}: weight {tensor!r} is in both {index[tensor]} and {name}"
                    )
                index[tensor] = name
        return index

    def read_model(self, names: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """The saved weights named in ``names`` (None: all of them), reading only the files that hold them.
        A name the checkpoint does not hold raises ``KeyError``."""
        index = self.model_index()
        if names is None:
            names = list(index)
        missing = [n for n in names if n not in index]
        if missing:
            raise KeyError(f"{self.path} holds no weights {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        return {n: self.file(index[n]).tensor(n) for n in names}

    @property
    def optimizer_groups(self) -> list[dict[str, Any]]:
        """The saved groups' metadata (numel, params, hparams, scalars); empty without optimizer state."""
        opt = self.meta.get("optimizer")
        return opt["groups"] if opt else []

    def read_shard(
        self, group: int, start: int, end: int, states: Sequence[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """Elements [start, end) of group ``group``'s flat space for every saved state (``master``, ...).

        ``states`` restricts the result to those state names.

        Only the saved shards overlapping [start, end) are opened, and only the bytes of the
        overlap are read (plus the rest of their verification blocks).
        """
        opt = self.meta.get("optimizer")
        if not opt:
            raise CheckpointCorruptError(f"{self.path} holds no optimizer state")
        if not 0 <= group < len(opt["groups"]):
            raise IndexError(f"group {group} out of range: the checkpoint has {len(opt['groups'])} groups")
        numel = opt["groups"][group]["numel"]
        if not 0 <= start <= end <= numel:
            raise ValueError(f"range [{start}, {end}) is not inside group {group}'s [0, {numel})")
        owners = [(int(r), *ranges[group]) for r, ranges in opt["shards"].items()]
        pieces = covering_pieces(owners, start, end, f"{self.path} group {group}")
        out = {}
        for state in opt["tensors"] if states is None else states:
            if state not in opt["tensors"]:
                raise KeyError(f"{self.path}: no optimizer state {state!r}; saved: {opt['tensors']}")
            name = f"g{group}.{state}"
            parts = []
            for owner, lo, hi in pieces:
                saved_start = opt["shards"][str(owner)][group][0]
                saved = self.file(optim_files(owner)[0])
                parts.append(saved.tensor_range(name, lo - saved_start, hi - saved_start))
            if not parts:  # an empty range: still return the saved dtype
                first_owner = min(int(r) for r in opt["shards"])
                parts.append(self.file(optim_files(first_owner)[0]).tensor_range(name, 0, 0))
            out[state] = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out

    def optimizer_shard(
        self, shards: Sequence[tuple[int, int]], rank: int, world_size: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """This rank's optimizer state for a new partitioning, in the ``ds-flat-shard/1`` format.

        ``shards[g]`` is the [start, end) of group g this rank will hold (end <= the group's numel).
        """
        opt = self.meta.get("optimizer")
        if not opt:
            raise CheckpointCorruptError(f"{self.path} holds no optimizer state")
        meta = new_shard_meta(opt["groups"], opt["extra"], shards, rank, world_size)
        tensors = {}
        for g, (start, end) in enumerate(shards):
            for state, t in self.read_shard(g, start, end).items():
                tensors[f"g{g}.{state}"] = t
        return tensors, meta

    def optimizer_shard_by_name(
        self, layout: dict[str, Any], saved_name: Callable[[str], str] | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """This rank's optimizer state for a layout whose parameters sit elsewhere than at save time.

        ``layout`` is a ``ds-flat-shard/1`` meta of the loading optimizer (its groups' ``numel``, ``shard``
        and ``params`` with name, shape and offset; group g matches the checkpoint's group g). Each parameter
        is found in the saved group by name (``saved_name`` maps a loading name to the saved one, e.g. a
        local expert index to the global one) and the part of it inside the layout's shard is read; elements
        of the shard outside every parameter (padding) are zero. The result is in ``layout``'s partitioning
        with the saved options, scalars and per-parameter entries.
        """
        opt = self.meta.get("optimizer")
        if not opt:
            raise CheckpointCorruptError(f"{self.path} holds no optimizer state")
        saved_groups = opt["groups"]
        if len(layout["groups"]) != len(saved_groups):
            raise CheckpointError(
                f"{self.path} holds {len(saved_groups)} optimizer parameter groups, the optimizer has "
                f"{len(layout['groups'])}: build the optimizer with the same groups"
            )
        rename = saved_name or (lambda n: n)
        tensors: dict[str, torch.Tensor] = {}
        groups = []
        for g, (target, saved) in enumerate(zip(layout["groups"], saved_groups, strict=True)):
            by_name = {p["name"]: p for p in saved["params"]}
            start, end = (int(x) for x in target["shard"])
            pieces = []  # (destination start, source start, length): this shard's part of each parameter
            params = []
            for p in target["params"]:
                name = rename(p["name"])
                entry = by_name.get(name)
                numel = torch.Size(p["shape"]).numel()
                if entry is None or torch.Size(entry["shape"]).numel() != numel:
                    found = "not there" if entry is None else f"of shape {entry['shape']}"
                    raise CheckpointError(
                        f"{self.path}: parameter {p['name']!r} (saved as {name!r}, shape {p['shape']}) is "
                        f"{found} in the checkpoint's optimizer group {g}: the model differs from the saved one"
                    )
                params.append({**entry, "name": p["name"], "shape": list(p["shape"]), "offset": p["offset"]})
                lo, hi = max(start, p["offset"]), min(end, p["offset"] + numel)
                if lo < hi:
                    pieces.append((lo - start, entry["offset"] + lo - p["offset"], hi - lo))
            for state in opt["tensors"]:
                first = self.read_shard(g, 0, 0, states=(state,))[state]
                flat = torch.zeros(end - start, dtype=first.dtype)
                for dst, src, n in pieces:
                    flat[dst : dst + n] = self.read_shard(g, src, src + n, states=(state,))[state]
                tensors[f"g{g}.{state}"] = flat
            groups.append({**saved, "numel": target["numel"], "shard": [start, end], "params": params})
        meta = {**layout, "format": SHARD_FORMAT, "groups": groups, "extra": opt["extra"]}
        return tensors, meta

    def restore_rng(self, rank: int) -> bool:
        """Restore this process's RNG states from the ones saved by ``rank``; False if none were saved."""
        if rank not in self.meta.get("rng_ranks", []):
            return False
        f = self.file(rng_file(rank))
        metadata = f.header().get("__metadata__", {})
        torch.set_rng_state(f.tensor("torch_cpu"))
        cuda = [n for n in f.names() if n.startswith("torch_cuda")]
        if cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([f.tensor(f"torch_cuda{i}") for i in range(len(cuda))])
        version, internal, gauss = json.loads(metadata["python"])
        random.setstate((version, tuple(internal), gauss))
        if "numpy" in metadata:
            import numpy as np

            kind, pos, has_gauss, cached = json.loads(metadata["numpy"])
            np.random.set_state(
                (kind, f.tensor("numpy_keys").numpy().astype("uint32"), pos, has_gauss, cached)
            )
        return True


def load_state(
    load_dir: str | os.PathLike, tag: str | None = None, *, load_model: bool = True
) -> LoadedState | None:
    """Open the checkpoint ``load_dir/tag`` (``tag`` None: the one named by ``latest``).

    Reads ``meta.json``, the model weights (if ``load_model``) and the JSON state; optimizer state
    is read later, per rank and per slice, through ``LoadedState.optimizer_shard``/``read_shard``.
    Returns None with a warning when ``tag`` is None and ``latest`` is missing (DeepSpeed's
    behaviour). Every file is checked against the sizes and digests recorded at save time.
    """
    path = resolve_checkpoint(load_dir, tag)
    if path is None:
        return None
    meta = read_meta(path)
    state = LoadedState(
        path=path,
        tag=meta["tag"],
        world_size=meta["world_size"],
        model_state=None,
        lr_scheduler=None,
        loss_scaler=None,
        counters={},
        client_state={},
        config=None,
        meta=meta,
    )
    if load_model and state.model_files:
        state.model_state = state.read_model()
    elif load_model:
        raise CheckpointNotFoundError(f"{path / MODEL_FILE}: the checkpoint was saved without model weights")

    def tensor(key: str) -> torch.Tensor:
        return state.file(STATE_FILE).tensor(key)

    for key in ("lr_scheduler", "loss_scaler", "counters", "client_state", "config"):
        setattr(state, key, decode(meta[key], tensor))
    return state


def read_shard(ckpt_dir: str | os.PathLike, group: int, start: int, end: int) -> dict[str, torch.Tensor]:
    """Elements [start, end) of every saved optimizer tensor of ``group`` in checkpoint ``ckpt_dir``.

    ``ckpt_dir`` is a tag directory (``save_dir/<tag>``). Keys are the state names (``master``,
    ``exp_avg``, ...). Reads only the overlapping ranges of the saved shard files.
    """
    state = load_state(Path(ckpt_dir).parent, Path(ckpt_dir).name, load_model=False)
    if state is None:  # unreachable: an explicit tag raises instead of returning None
        raise CheckpointNotFoundError(f"checkpoint directory {ckpt_dir} does not exist")
    return state.read_shard(group, start, end)
