"""Reading a DeepSpeed config as DeepSpeed reads it: a dict, a JSON or hjson file, or base64; and DeepSpeed
0.19.8's defaults where they differ from ds's. ``deepspeed.initialize``, ``DeepSpeedConfig`` and the section
``get_*`` functions all go through here, so they agree on what a config means."""

from __future__ import annotations

import base64
import copy
import os
from typing import Any

import hjson

from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys

__all__ = ["DEEPSPEED_DEFAULTS", "deepspeed_defaults", "load_param_dict"]

# Config defaults where DeepSpeed 0.19.8 differs from ds's own (which follow the config reference and
# docs/design.md §2): 0.19 clips gradients to norm 1.0 unless the config says otherwise, and its fp16 loss
# scale starts at 2**16 (ds_engine's at 2**32). Without these, a config that leaves the keys out (the
# Trainer's and Accelerate's usual ones) would train differently under `import deepspeed`.
DEEPSPEED_DEFAULTS = {"gradient_clipping": 1.0, "fp16": {"initial_scale_power": 16}}


def load_param_dict(config: Any) -> dict[str, Any]:
    """The raw config dict of ``config``: a dict (copied), a JSON or hjson file, or base64 JSON/hjson.

    A key given twice in a file is an error, as in DeepSpeed.
    """
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, os.PathLike)) and os.path.exists(config):
        with open(config) as f:
            return hjson.load(f, object_pairs_hook=dict_raise_error_on_duplicate_keys)
    try:
        decoded = base64.urlsafe_b64decode(config).decode("utf-8")
        return hjson.loads(decoded, object_pairs_hook=dict_raise_error_on_duplicate_keys)
    except (UnicodeDecodeError, AttributeError, ValueError, TypeError):
        raise ValueError(
            "Expected a string path to an existing deepspeed config, or a dictionary or a valid base64. "
            f"Received: {config}"
        ) from None


def deepspeed_defaults(param_dict: dict[str, Any]) -> dict[str, Any]:
    """``param_dict`` with DeepSpeed 0.19.8's defaults filling the keys it leaves out, where they differ from
    ds's: :data:`DEEPSPEED_DEFAULTS` (a section default only fills a section the config has), and
    ``zero_optimization.overlap_comm`` true at ZeRO stage 3 (DeepSpeed's ZeRO model decides it by stage)."""
    out = dict(param_dict)
    for key, value in DEEPSPEED_DEFAULTS.items():
        if isinstance(value, dict):
            if isinstance(out.get(key), dict):
                out[key] = {**value, **out[key]}
        else:
            out.setdefault(key, value)
    zero = out.get("zero_optimization")
    if isinstance(zero, dict) and zero.get("stage") == 3 and zero.get("overlap_comm") is None:
        out["zero_optimization"] = {**zero, "overlap_comm": True}
    return out
