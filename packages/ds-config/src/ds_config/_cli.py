"""``python -m ds_config explain|validate cfg.json``: check a config and show what it means."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any

from pydantic import BaseModel

from ._errors import ConfigError
from ._load import DEFAULT_WORLD_SIZE_SOURCE, load_config
from ._models import DSConfig

__all__ = ["main"]


def _world_size(arg: int | None) -> tuple[int | None, str]:
    if arg is not None:
        return arg, "explicit argument (--world-size)"
    for var, source in (("OMPI_COMM_WORLD_SIZE", "MPI environment"), ("PMI_SIZE", "MPI environment"),
                        ("WORLD_SIZE", "launcher environment")):  # fmt: skip
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var]), f"{source} ({var})"
    return None, DEFAULT_WORLD_SIZE_SOURCE


def _auto_values(pairs: list[str]) -> dict[str, Any]:
    values = {}
    for pair in pairs:
        path, _, text = pair.partition("=")
        try:
            values[path] = json.loads(text)
        except json.JSONDecodeError:
            values[path] = text
    return values


def _flatten(model: BaseModel, prefix: str, given: bool) -> list[tuple[str, Any, str]]:
    """(dotted key, value, "given"/"default") for every effective setting, nested sections expanded."""
    rows: list[tuple[str, Any, str]] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{prefix}{name}"
        origin = "given" if given and name in model.model_fields_set else "default"
        if isinstance(value, BaseModel):
            rows += _flatten(value, key + ".", given and name in model.model_fields_set)
        else:
            rows.append((key, value, origin))
    extra = model.__pydantic_extra__ or {}
    rows += [(f"{prefix}{k}", v, "given (passed through)") for k, v in extra.items()]
    return rows


def explain(cfg: DSConfig) -> str:
    """A readable account of the derived batch sizes, the main modes, and every effective setting."""
    b = cfg.batch
    zero = cfg.zero_optimization
    lines = [
        "Batch sizes",
        f"  world size (data parallel)      {b.world_size}   [{b.world_size_source}]",
        f"  train_micro_batch_size_per_gpu  {b.train_micro_batch_size_per_gpu}",
        f"  gradient_accumulation_steps     {b.gradient_accumulation_steps}",
        f"  train_batch_size                {b.train_batch_size}"
        f"   (= {b.train_micro_batch_size_per_gpu} x {b.gradient_accumulation_steps} x {b.world_size})",
        "",
        "Training",
        f"  precision        {cfg.precision}",
        f"  ZeRO stage       {zero.stage}"
        + (f"  (optimizer offload: {zero.offload_device})" if zero.stage else ""),
        f"  optimizer        {cfg.optimizer.type if cfg.optimizer else 'none (client optimizer)'}",
        f"  scheduler        {cfg.scheduler.type if cfg.scheduler else 'none'}",
        f"  gradient clip    {cfg.gradient_clipping or 'off'}",
        f"  sparse attention {cfg.sparse_attention.mode if cfg.sparse_attention else 'off'}",
        "",
        "Every effective setting (given | derived | default)",
    ]
    derived = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}
    rows = _flatten(cfg, "", True)
    width = max(len(key) for key, _, _ in rows)
    for key, value, origin in rows:
        if key in derived and origin == "default":
            origin = "derived"
        lines.append(f"  {key.ljust(width)}  {json.dumps(value)}   [{origin}]")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m ds_config``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m ds_config", description=__doc__)
    parser.add_argument("command", choices=["explain", "validate"])
    parser.add_argument("config", help="path to a DeepSpeed JSON config (or a base64 JSON string)")
    parser.add_argument(
        "--world-size", type=int, default=None, help="data-parallel world size (default: env, else 1)"
    )
    parser.add_argument(
        "--non-strict", action="store_true", help="warn about unknown keys instead of failing"
    )
    parser.add_argument("--auto", action="append", default=[], metavar="PATH=VALUE",
                        help='resolve an "auto" value, e.g. --auto train_micro_batch_size_per_gpu=8')  # fmt: skip
    args = parser.parse_args(argv)
    world_size, source = _world_size(args.world_size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cfg = load_config(args.config, world_size=world_size, world_size_source=source,
                              strict=not args.non_strict, auto_values=_auto_values(args.auto))  # fmt: skip
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 1
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    if args.command == "validate":
        b = cfg.batch
        print(f"OK: {args.config} is valid (train_batch_size {b.train_batch_size} = "
              f"{b.train_micro_batch_size_per_gpu} x {b.gradient_accumulation_steps} x world size {b.world_size})")  # fmt: skip
    else:
        print(explain(cfg))
    return 0
