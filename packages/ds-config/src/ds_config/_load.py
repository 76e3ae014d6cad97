"""``load_config``: source -> raw dict -> prepared dict -> models -> cross-key rules -> batch sizes."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ._batch import BatchSizes, derive_batch_sizes
from ._elasticity import ElasticityError, elastic_batch
from ._errors import DEPRECATED_WITH_REPLACEMENT, ConfigError, ConfigProblem, config_error
from ._fields import warn_no_effect
from ._models import SPARSE_ATTENTION_MODES, DSConfig
from ._prepare import prepare
from ._rules import check_rules
from ._source import ConfigSource, read_source

__all__ = ["load_config", "DEFAULT_WORLD_SIZE_SOURCE"]

DEFAULT_WORLD_SIZE_SOURCE = "default 1 (no world size given, torch.distributed not initialised)"


def load_config(
    source: ConfigSource,
    *,
    world_size: int | None = None,
    world_size_source: str | None = None,
    strict: bool = True,
    auto_values: dict[str, Any] | None = None,
) -> DSConfig:
    """Load and validate a DeepSpeed config; derive the batch sizes for ``world_size``.

    Args:
        source: a dict, a path to a JSON file, or a (urlsafe) base64-encoded JSON string.
        world_size: the data-parallel world size; ``None`` means 1.
        world_size_source: where ``world_size`` came from, for the error message (e.g. ``"torch.distributed"``,
            ``"MPI environment"``); defaults to ``"explicit argument"`` or, with no world size, ``"default 1"``.
        strict: unknown keys are errors (default); ``False`` warns (:class:`ConfigWarning`) and ignores them.
        auto_values: values for Hugging Face ``"auto"`` placeholders, by dotted path
            (``{"train_micro_batch_size_per_gpu": 8, "optimizer.params.lr": 3e-4}``).

    Returns:
        The validated :class:`DSConfig`; its three batch fields are all set, and ``cfg.batch`` holds them
        with the world size used.

    Raises:
        ConfigError: with every problem found (dotted key path, value, what was expected).
    """
    if world_size_source is None:
        world_size_source = "explicit argument" if world_size is not None else DEFAULT_WORLD_SIZE_SOURCE
    data, origin = read_source(source)
    prep = prepare(data, strict=strict, auto_values=auto_values)
    problems = list(prep.problems)
    if prep.auto_paths:
        problems += [
            ConfigProblem(
                path, 'unresolved "auto" value: pass auto_values={"' + path + '": ...} to load_config', "auto"
            )
            for path in prep.auto_paths
        ]
    world = 1 if world_size is None else world_size
    try:
        cfg = DSConfig.model_validate(data)
    except ValidationError as exc:
        # Cross-key rules need a whole valid config, but the batch sizes only need their own three keys.
        problems += _translate(exc)
        if not any(p.path in _BATCH_KEYS for p in problems):
            raw = (data.get(key) for key in _BATCH_ORDER)  # valid JSON integers, possibly written as 32.0
            _derive(*(int(v) if isinstance(v, float) else v for v in raw), world, world_size_source, problems)
        raise config_error(problems, origin) from None
    problems += check_rules(cfg)
    batch = None
    if cfg.elasticity.enabled:
        batch = _elastic(cfg, world, world_size_source, problems)
    elif not any(p.path in _BATCH_KEYS for p in problems):
        batch = _derive(*(getattr(cfg, key) for key in _BATCH_ORDER), world, world_size_source, problems)
    if problems or batch is None:
        raise config_error(problems, origin)
    warn_no_effect(cfg)
    return _with_batch(cfg, batch)


_BATCH_ORDER = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_BATCH_KEYS = set(_BATCH_ORDER)


def _derive(
    tbs: int | None, mbs: int | None, gas: int | None, world: int, source: str, problems: list[ConfigProblem]
) -> BatchSizes | None:
    try:
        return derive_batch_sizes(tbs, mbs, gas, world, source)
    except ConfigError as exc:
        problems += exc.problems
        return None


_ELASTIC_CONFLICT = (
    "One or more batch related parameters were found in your ds_config (train_batch_size, "
    "train_micro_batch_size_per_gpu, and/or gradient_accumulation_steps). These parameters *will not be used* "
    "since elastic training is enabled, which takes control of these parameters. If you want to suppress this "
    "error (the parameters will be silently ignored) please set 'ignore_non_elastic_batch_info':true in your "
    "elasticity config."
)


def _elastic(cfg: DSConfig, world: int, source: str, problems: list[ConfigProblem]) -> BatchSizes | None:
    """The batch sizes DeepSpeed's elastic section gives ``world`` data-parallel ranks (DeepSpeed's engine:
    the batch keys given beside it are an error unless ``ignore_non_elastic_batch_info``)."""
    section = cfg.elasticity
    given = [key for key in _BATCH_ORDER if key in cfg.model_fields_set]
    if given and not section.ignore_non_elastic_batch_info:
        problems.append(ConfigProblem("elasticity", _ELASTIC_CONFLICT, given))
        return None
    try:
        tbs, mbs, gas, _ = elastic_batch(section.model_dump(exclude_unset=True) | {"enabled": True}, world)
    except (ElasticityError, ValueError, AssertionError) as exc:
        problems.append(ConfigProblem("elasticity", f"{type(exc).__name__}: {exc}", world))
        return None
    return _derive(tbs, mbs, gas, world, source, problems)


def _with_batch(cfg: DSConfig, batch: BatchSizes) -> DSConfig:
    # Keep which keys the user gave (model_fields_set) so the explain output can tell given from derived.
    given = set(cfg.model_fields_set)
    cfg.train_batch_size = batch.train_batch_size
    cfg.train_micro_batch_size_per_gpu = batch.train_micro_batch_size_per_gpu
    cfg.gradient_accumulation_steps = batch.gradient_accumulation_steps
    object.__setattr__(cfg, "__pydantic_fields_set__", given)
    cfg._batch = batch
    return cfg


# --------------------------------------------------------------------------------------------- pydantic errors
_COMPARISONS = (
    ("greater than or equal to", ">="),
    ("less than or equal to", "<="),
    ("greater than", ">"),
    ("less than", "<"),
)
_UNION_TAGS = ("float", "int", "str", "bool", "none", "dict", "list")


def _path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for i, part in enumerate(loc):
        if isinstance(part, int):
            if parts:
                parts[-1] += f"[{part}]"
            else:
                parts.append(f"[{part}]")
            continue
        if i == 1 and loc[0] == "sparse_attention" and part in SPARSE_ATTENTION_MODES:
            continue  # the discriminated union's tag is not a key
        if part in _UNION_TAGS or "[" in part:
            continue  # a union member's tag (e.g. "literal['dynamic']") is not a key either
        parts.append(part)
    return ".".join(parts) or "<root>"


def _message(error: dict[str, Any]) -> str:
    text = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    if text.startswith("Input should be "):
        text = "expected " + text[len("Input should be ") :]
    for words, symbol in _COMPARISONS:
        text = text.replace(f"expected {words}", f"expected a value {symbol}")
    if error["type"] == "missing":
        text = "required key is missing"
    return text


def _translate(exc: ValidationError) -> list[ConfigProblem]:
    """One problem per key path; a union's per-member complaints are merged with "or"."""
    merged: dict[str, tuple[Any, list[str]]] = {}
    conflicts = set()
    for error in exc.errors():
        path = _path(error["loc"])
        if error["type"] == DEPRECATED_WITH_REPLACEMENT:
            conflicts.add(path)
        value = error.get("input")
        message = _message(error)
        if path not in merged:
            merged[path] = (value, [message])
        elif message not in merged[path][1]:
            merged[path][1].append(message)
    problems = []
    for path, (value, messages) in merged.items():
        text = " or ".join(messages)
        conflict = path in conflicts
        if isinstance(value, dict) or messages == ["required key is missing"]:
            # the whole section as a value says nothing useful
            problems.append(ConfigProblem(path, text, deprecated_with_replacement=conflict))
        else:
            problems.append(ConfigProblem(path, text, value, deprecated_with_replacement=conflict))
    return problems
