"""save_state: every rank writes its own files into a hidden directory that is renamed into place."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ._errors import ClientStateError, ShardFormatError, TagValidationError
from ._format import (
    FORMAT,
    LATEST_FILE,
    META_FILE,
    MODEL_FILE,
    SHARD_FORMAT,
    STATE_FILE,
    _fsync_dir,
    check_model_file_name,
    optim_files,
    rng_file,
    seal_meta,
    write_json,
    write_safetensors,
    write_text_atomic,
)

TAG_VALIDATION_MODES = ("warn", "ignore", "fail")


# ------------------------------------------------------------------------------- JSON + tensors
def encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``value`` as JSON; tensors go into ``tensors`` under their key path and leave a reference.

    Tuples survive the round trip (``{"__tuple__": [...]}``); anything that is not a dict with str
    keys, list, tuple, str, int, float, bool, None or a tensor raises ``ClientStateError``.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        tensors[path] = value
        return {"__tensor__": path}
    if isinstance(value, (list, tuple)):
        items = [encode(v, f"{path}[{i}]", tensors) for i, v in enumerate(value)]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        out = {}
        for key, v in value.items():
            if not isinstance(key, str):
                raise ClientStateError(
                    f"{path}: key {key!r} is a {type(key).__name__}; checkpoint keys must be str (JSON)"
                )
            if key in ("__tensor__", "__tuple__"):
                raise ClientStateError(f"{path}: the key {key!r} is reserved by the checkpoint format")
            out[key] = encode(v, f"{path}[{key!r}]", tensors)
        return out
    hint = " (use .item() or .tolist(), or a torch tensor)" if type(value).__module__ == "numpy" else ""
    raise ClientStateError(
        f"{path}: a value of type {type(value).__module__}.{type(value).__qualname__} cannot be saved "
        f"without pickle{hint}. Allowed: dict with str keys, list, tuple, str, int, float, bool, None, "
        "torch.Tensor."
    )


# ------------------------------------------------------------------------------- process group
def _rank_world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier(group: dist.ProcessGroup | None) -> None:
    if _distributed():
        dist.barrier(group=group)


def agree_on_save_dir(save_dir: str | os.PathLike, group: dist.ProcessGroup | None = None) -> Path:
    """Rank 0's ``save_dir``, on every rank: the folder one save writes into.

    A script that names its folder by a per-rank timestamp (DeepSpeed's BERT pre-training example does)
    passes a different ``save_dir`` on each rank. DeepSpeed then scatters one checkpoint over several
    folders that it cannot load back; here every rank writes into rank 0's folder, so the checkpoint is
    complete and loads, and rank 0 warns once naming the folders the other ranks asked for.
    """
    mine = os.path.abspath(save_dir)
    if not _distributed():
        return Path(save_dir)
    paths: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(paths, mine, group=group)
    differing = [(r, p) for r, p in enumerate(paths) if p != paths[0]]
    if differing and _rank_world(group)[0] == 0:
        asked = ", ".join(f"rank {r}: {p!r}" for r, p in differing)
        warnings.warn(
            f"save_checkpoint: the ranks passed different save_dirs; every rank writes into rank 0's "
            f"{paths[0]!r} so that the checkpoint is complete and loads. The others asked for {asked}. Pass the "
            "same save_dir on every rank (for a timestamped name, make it on rank 0 and broadcast it, e.g. "
            "with torch.distributed.broadcast_object_list) to silence this",
            stacklevel=3,
        )
    return Path(paths[0]) if differing else Path(save_dir)


def validate_tag(tag: str, mode: str = "Warn", group: dist.ProcessGroup | None = None) -> bool:
    """Check that every rank passed the same ``tag`` (``checkpoint.tag_validation``).

    The SHA-1 digest of the tag is all-reduced with MIN and MAX; they differ iff some rank's tag
    differs. ``Warn`` warns, ``Fail`` raises ``TagValidationError``, ``Ignore`` skips the collective.
    Returns whether the tags agreed (True when ignored or not distributed).
    """
    mode_key = str(mode).lower()
    if mode_key not in TAG_VALIDATION_MODES:
        raise ValueError(
            f"checkpoint.tag_validation is {mode!r}, expecting one of ['Warn', 'Ignore', 'Fail']"
        )
    if mode_key == "ignore" or not _distributed():
        return True
    digest = torch.tensor(list(hashlib.sha1(tag.encode()).digest()), dtype=torch.int64)
    lo, hi = digest.clone(), digest.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    if torch.equal(lo, hi):
        return True
    msg = (
        f"[rank={dist.get_rank()}] The checkpoint tag name '{tag}' is not consistent across all ranks. "
        "Including rank unique information in checkpoint tag could cause issues when restoring with "
        "different world sizes."
    )
    if mode_key == "fail":
        raise TagValidationError(msg)
    warnings.warn(msg, stacklevel=3)
    return False


# ------------------------------------------------------------------------------- shard checks
def check_shard(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Raise ``ShardFormatError`` unless ``(tensors, meta)`` is a valid ``ds-flat-shard/1`` shard."""
    if meta.get("format") != SHARD_FORMAT:
        raise ShardFormatError(
            f"optimizer shard meta['format'] is {meta.get('format')!r}, expected {SHARD_FORMAT!r}"
        )
    groups = meta.get("groups")
    if not isinstance(groups, list):
        raise ShardFormatError("optimizer shard meta['groups'] must be a list")
    for g, group in enumerate(groups):
        start, end = group["shard"]
        if not 0 <= start <= end <= group["numel"]:
            raise ShardFormatError(f"group {g}: shard {group['shard']} is not inside [0, {group['numel']}]")
        for p in group["params"]:
            n = 1
            for d in p["shape"]:
                n *= d
            if p["offset"] + n > group["numel"]:
                raise ShardFormatError(f"group {g}: param {p['name']!r} ends beyond numel {group['numel']}")
    for name, t in tensors.items():
        g_str, _, _ = name.partition(".")
        if not (g_str.startswith("g") and g_str[1:].isdigit() and int(g_str[1:]) < len(groups)):
            raise ShardFormatError(f"optimizer tensor {name!r}: names must be 'g<group>.<state>'")
        start, end = groups[int(g_str[1:])]["shard"]
        if t.dim() != 1 or t.numel() != end - start:
            raise ShardFormatError(
                f"optimizer tensor {name!r} has shape {list(t.shape)}; element-wise state of shard "
                f"[{start}, {end}) must be 1-D with {end - start} elements"
            )


def _replicated(meta: dict[str, Any]) -> bool:
    return all(g["shard"] == [0, g["numel"]] or tuple(g["shard"]) == (0, g["numel"]) for g in meta["groups"])


# ------------------------------------------------------------------------------- RNG
def rng_tensors() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """This process's RNG states: torch CPU (+ CUDA) as tensors, Python and NumPy as JSON metadata."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda{i}"] = state
    version, internal, gauss = random.getstate()
    metadata = {"python": json.dumps([version, list(internal), gauss])}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        tensors["numpy_keys"] = torch.from_numpy(keys.astype("int64"))
        metadata["numpy"] = json.dumps([kind, pos, has_gauss, cached])
    except ImportError:
        pass
    return tensors, metadata


# ------------------------------------------------------------------------------- the save
def _clean_stale(save_dir: Path) -> None:
    """Tidy up after a save that was killed.

    A half-written ``.<tag>.tmp`` is removed. A ``.<tag>.old`` is the complete previous save of a tag
    that was being overwritten: if the kill came between the two renames of :func:`_publish` (so
    ``<tag>`` is missing), it is moved back into place; otherwise it is a leftover and removed.
    """
    for entry in save_dir.iterdir():
        if not (entry.name.startswith(".") and entry.is_dir()):
            continue
        if entry.name.endswith(".old") and not (save_dir / entry.name[1:-4]).exists():
            os.replace(entry, save_dir / entry.name[1:-4])
        elif entry.name.endswith((".tmp", ".old")):
            shutil.rmtree(entry, ignore_errors=True)


def _write_rank(
    tmp: Path,
    rank: int,
    shard: tuple[dict, dict] | None,
    save_rng: bool,
    model_files: dict[str, dict[str, torch.Tensor]],
) -> dict[str, Any]:
    """This rank's own files: its optimizer shard, its RNG states and its weight files. Returns the
    manifest part."""
    files: dict[str, Any] = {}
    report: dict[str, Any] = {"rank": rank, "files": files, "model_files": sorted(model_files)}
    for name, tensors in model_files.items():
        files[name] = write_safetensors(tmp / name, tensors)
    if shard is not None:
        tensors, meta = shard
        t_name, j_name = optim_files(rank)
        files[t_name] = write_safetensors(tmp / t_name, tensors)
        files[j_name] = write_json(tmp / j_name, meta)
        report["shards"] = [list(g["shard"]) for g in meta["groups"]]
        report["tensors"] = sorted(k.partition(".")[2] for k in tensors if k.startswith("g0."))
        if rank == 0:  # group metadata is the same on every rank: gather it once
            report["groups"] = [{k: v for k, v in g.items() if k != "shard"} for g in meta["groups"]]
            report["extra"] = meta.get("extra", {})
    if save_rng:
        tensors, metadata = rng_tensors()
        files[rng_file(rank)] = write_safetensors(tmp / rng_file(rank), tensors, metadata)
    return report


def _gather(report: dict[str, Any], group: dist.ProcessGroup | None) -> list[dict[str, Any]]:
    if not _distributed():
        return [report]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, report, group=group)
    return out


def _optimizer_meta(tmp: Path, reports: list[dict[str, Any]]) -> dict[str, Any] | None:
    owners = [r for r in reports if "shards" in r]
    if not owners:
        return None
    if "groups" in owners[0]:
        groups, extra = owners[0]["groups"], owners[0]["extra"]
    else:  # rank 0 held no shard: take the group metadata from the first owner's file
        meta = json.loads((tmp / optim_files(owners[0]["rank"])[1]).read_text())
        groups = [{k: v for k, v in g.items() if k != "shard"} for g in meta["groups"]]
        extra = meta.get("extra", {})
    return {
        "groups": groups,
        "extra": extra,
        "tensors": owners[0]["tensors"],
        "shards": {str(r["rank"]): r["shards"] for r in owners},
    }


def _one_writer_per_file(names: list[str], group: dist.ProcessGroup | None) -> None:
    """Raise on every rank, before anything is written, when two ranks would write the same weight file."""
    every = [names]
    if _distributed() and dist.get_world_size(group) > 1:
        every = [None] * dist.get_world_size(group)
        dist.all_gather_object(every, names, group=group)
    seen: dict[str, int] = {}
    for r, mine in enumerate(every):
        for name in mine:
            if name in seen:
                raise ValueError(
                    f"save_state: ranks {seen[name]} and {r} would both write the weight file {name}"
                )
            seen[name] = r


def _natural(name: str) -> list:
    """Sort key reading digit runs as numbers (``layer_2_expert_10`` after ``layer_2_expert_9``)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _publish(save_dir: Path, tag: str, tmp: Path) -> Path:
    final = save_dir / tag
    if final.exists():
        # rename() cannot replace a non-empty directory: move the old one aside first.
        old = save_dir / f".{tag}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(save_dir)
    return final


def save_state(
    save_dir: str | os.PathLike,
    tag: str,
    *,
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_shard: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
    lr_scheduler: dict[str, Any] | None = None,
    loss_scaler: dict[str, Any] | None = None,
    counters: dict[str, Any] | None = None,
    client_state: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    save_rng: bool = True,
    save_latest: bool = True,
    tag_validation: str = "Warn",
    group: dist.ProcessGroup | None = None,
    model_files: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Save a training state to ``save_dir/tag`` atomically; call it on every rank of ``group``.

    Rank 0 writes ``model_state`` (the module's state dict, already whole on every rank) and the
    JSON-able state (``lr_scheduler``, ``loss_scaler``, ``counters``, ``client_state``, ``config``;
    tensors inside them go to ``state.safetensors``). Every rank writes its ``optimizer_shard`` in
    the ``ds-flat-shard/1`` format (a shard covering every group whole is written by rank 0 only)
    and its RNG states. ``model_files`` (any rank) are weight files of their own besides rank 0's
    ``model.safetensors`` (an MoE model's experts, one file per expert: ``expert_file``); on load their
    tensors join ``model_state``, so each tensor name must be in one file only. Files are written into ``save_dir/.<tag>.tmp``, which is renamed to
    ``save_dir/<tag>`` after every rank has finished; ``latest`` is replaced after that.
    Returns the checkpoint directory.
    """
    tag = str(tag)
    if not tag or tag.startswith(".") or "/" in tag or os.sep in tag:
        raise ValueError(
            f"checkpoint tag {tag!r} must be a non-empty name without '/' that does not start with '.'"
        )
    rank, world_size = _rank_world(group)
    for name in model_files or {}:
        check_model_file_name(name)
    _one_writer_per_file(sorted(model_files or {}), group)
    validate_tag(tag, tag_validation, group)
    save_dir = agree_on_save_dir(save_dir, group)
    if _distributed():
        # Every rank must write into the same directory: rank 0's tag wins if they differ.
        tags = [tag]
        dist.broadcast_object_list(tags, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        tag = tags[0]
    if optimizer_shard is not None:
        check_shard(*optimizer_shard)
        if rank != 0 and _replicated(optimizer_shard[1]):
            optimizer_shard = None  # every rank holds the same whole state: rank 0's copy suffices
    state_tensors: dict[str, torch.Tensor] = {}
    payload = {
        "lr_scheduler": encode(lr_scheduler, "lr_scheduler", state_tensors),
        "loss_scaler": encode(loss_scaler, "loss_scaler", state_tensors),
        "counters": encode(counters or {}, "counters", state_tensors),
        "client_state": encode(client_state or {}, "client_state", state_tensors),
        "config": encode(config, "config", state_tensors),
    }
    save_dir = Path(save_dir)
    tmp = save_dir / f".{tag}.tmp"
    if rank == 0:
        save_dir.mkdir(parents=True, exist_ok=True)
        _clean_stale(save_dir)
        tmp.mkdir()
    _barrier(group)
    report = _write_rank(tmp, rank, optimizer_shard, save_rng, model_files or {})
    if rank == 0:
        if model_state is not None:
            report["files"][MODEL_FILE] = write_safetensors(tmp / MODEL_FILE, model_state)
        if state_tensors:
            report["files"][STATE_FILE] = write_safetensors(tmp / STATE_FILE, state_tensors)
    reports = _gather(report, group)
    parts = sorted((name for r in reports for name in r["model_files"]), key=_natural)
    if rank == 0:
        weights = ([MODEL_FILE] if MODEL_FILE in report["files"] else []) + parts
        meta = {
            "format": FORMAT,
            "writer": "ds_checkpoint",
            "tag": tag,
            "world_size": world_size,
            **payload,
            "optimizer": _optimizer_meta(tmp, reports),
            "model_files": weights,
            "rng_ranks": [r["rank"] for r in reports if rng_file(r["rank"]) in r["files"]],
            "files": {name: entry for r in reports for name, entry in r["files"].items()},
        }
        write_json(tmp / META_FILE, seal_meta(meta))
        _fsync_dir(tmp)
        _publish(save_dir, tag, tmp)
        if save_latest:
            write_text_atomic(save_dir / LATEST_FILE, tag)
    _barrier(group)
    return save_dir / tag
