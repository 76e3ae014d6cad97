"""Safe reading of files written by the ``deepspeed`` package, and the shard metadata built from them.

Files are read with ``torch.load(weights_only=True)``: torch's restricted unpickler, which only
rebuilds tensors, storages, ``torch.Size``, ``OrderedDict`` and plain containers/numbers/strings,
plus exactly these DeepSpeed names, each mapped to an inert stand-in defined here (DeepSpeed
itself is never imported and no DeepSpeed code runs):

* ``deepspeed.runtime.fp16.loss_scaler.LossScaler`` / ``DynamicLossScaler`` -> ``PickledState``
  (keeps the pickled attribute dict, nothing else)
* ``deepspeed.utils.tensor_fragment.fragment_address`` -> ``PickledState``
* ``deepspeed.runtime.zero.config.ZeroStageEnum`` -> ``int``-returning function

Any other global in a file makes the load fail with ``DeepSpeedImportError`` naming the file.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from ._errors import CheckpointCorruptError, CheckpointNotFoundError, DeepSpeedImportError
from ._format import SHARD_FORMAT


class PickledState:
    """Inert stand-in for an allowed DeepSpeed object: only its pickled attribute dict is kept."""

    def __setstate__(self, state: Any) -> None:
        self.__dict__["state"] = state if isinstance(state, dict) else {"value": state}

    def as_dict(self) -> dict[str, Any]:
        """The pickled attributes."""
        return dict(self.__dict__.get("state", {}))


def _zero_stage(value: Any) -> int:
    return int(value)


ALLOWED_GLOBALS: list[tuple[Any, str]] = [
    (PickledState, "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
    (PickledState, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"),
    (PickledState, "deepspeed.utils.tensor_fragment.fragment_address"),
    (_zero_stage, "deepspeed.runtime.zero.config.ZeroStageEnum"),
]


def safe_torch_load(path: Path) -> Any:
    """``torch.load`` with weights_only and the DeepSpeed allow-list; errors name the file."""
    if not path.is_file():
        raise CheckpointNotFoundError(f"DeepSpeed checkpoint file {path} does not exist")
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported global" in str(e) or "not an allowed global" in str(e):
            first = str(e).split("\n")[0]
            raise DeepSpeedImportError(
                f"{path}: refused to unpickle a class outside the allow-list: {first}"
            ) from None
        raise CheckpointCorruptError(
            f"{path} is not a readable torch checkpoint (truncated or tampered?): {e}"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointCorruptError(
            f"{path} is not a readable torch checkpoint (truncated or tampered?): {e}"
        ) from None


def plain(value: Any) -> Any:
    """Stand-ins and tensors inside scaler/scheduler state as plain JSON-able values."""
    if isinstance(value, PickledState):
        return plain(value.as_dict())
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value


def group_meta(names_shapes: dict[str, Any], hparams: dict[str, Any], step: Any) -> dict[str, Any]:
    """One optimizer group's ``ds-flat-shard/1`` entry: its parameters laid end to end, unpadded."""
    params, offset = [], 0
    for name, shape in names_shapes.items():
        params.append({"name": name, "shape": [int(d) for d in shape], "offset": offset})
        offset += torch.Size(shape).numel()
    return {
        "numel": offset,
        "params": params,
        "hparams": {k: plain(v) for k, v in hparams.items() if k != "params"},
        "scalars": {"step": plain(step)},
    }


def tensor_scalars(state: dict[Any, dict[str, Any]]) -> list[str]:
    """Names of optimizer-state scalars held as tensors (torch's Adam ``step``): ds-zero's loader gives
    them back as tensors, which torch's optimizers require."""
    return sorted(
        {k for st in state.values() for k, v in st.items() if torch.is_tensor(v) and v.numel() == 1}
    )


def shard_meta(osd: dict[str, Any], groups: list[dict], rank: int, world: int) -> dict[str, Any]:
    """``ds-flat-shard/1`` metadata for ``groups`` with what DeepSpeed's optimizer state ``osd`` records."""
    # ZeRO 1/2 and 3 wrap the torch optimizer's state dict; ZeRO 0 saves it plain
    base = osd.get("base_optimizer_state") or osd.get("optimizer_state_dict") or osd
    extra = {
        "loss_scaler": plain(osd.get("loss_scaler")),
        "dynamic_loss_scale": osd.get("dynamic_loss_scale"),
        "clip_grad": osd.get("clip_grad"),
        "tensor_scalars": tensor_scalars(base.get("state", {})),
    }
    return {"format": SHARD_FORMAT, "world_size": world, "rank": rank, "groups": groups, "extra": extra}


def optimizer_state(path: Path) -> dict[str, Any]:
    """The ``optimizer_state_dict`` entry of a DeepSpeed ZeRO optimizer file."""
    loaded = safe_torch_load(path)
    if not isinstance(loaded, dict) or not isinstance(loaded.get("optimizer_state_dict"), dict):
        raise CheckpointCorruptError(
            f"{path} has no 'optimizer_state_dict' entry (not a DeepSpeed ZeRO file?)"
        )
    return loaded["optimizer_state_dict"]
