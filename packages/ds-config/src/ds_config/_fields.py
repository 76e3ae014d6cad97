"""Every leaf key of the config, and the one table of keys that have no effect in ds.

A leaf is a field whose value is not itself a section model: ``fp16.loss_scale``, ``optimizer.params``,
``sparse_attention.block``. Every leaf must be read by some package (its ``CONFIG_FIELDS`` tuple says
so; ``tools/checks/check_config_consumers.py`` checks it) or appear in :data:`NO_EFFECT` with the reason.
"""

from __future__ import annotations

import types
import typing
import warnings
from typing import Any

from pydantic import BaseModel

from ._compat import compat_no_effect
from ._errors import ConfigWarning

__all__ = ["CONFIG_FIELDS", "NO_EFFECT", "leaf_paths", "section_models", "warn_no_effect"]

# Keys whose whole effect happens inside ds_config: the boolean "zero_optimization": true form takes its
# bucket size from allgather_size; cpu_offload_param becomes offload_param; offload_optimizer.ratio is refused below 1 (a ZeRO-3 feature);
# sparse_attention.mode chooses which section model the section is (ds_sparse_attn dispatches on it).
CONFIG_FIELDS: tuple[str, ...] = (
    "allgather_size",
    "zero_optimization.cpu_offload_param",
    "zero_optimization.offload_optimizer.ratio",
    "sparse_attention.mode",
    "data_types.grad_accum_dtype",  # sets bf16.grad_accum_dtype, or is refused (_rules.grad_accum_dtype)
    "tensor_parallel.tp.tp_size",  # checked against autotp_size (_rules.py)
    # elastic batch sizing: load_config derives the three batch sizes from them (_elasticity.py)
    "elasticity.enabled",
    "elasticity.max_train_batch_size",
    "elasticity.micro_batch_sizes",
    "elasticity.min_gpus",
    "elasticity.max_gpus",
    "elasticity.version",
    "elasticity.prefer_larger_batch",
    "elasticity.ignore_non_elastic_batch_info",
    "elasticity.num_gpus_per_node",
    "elasticity.model_parallel_size",
)

_PIPE_MODULE_DECIDES = (
    "read nowhere in DeepSpeed 0.19.8 either: the PipelineModule's own arguments (num_stages / topology, "
    "partition_method, seed_layers) decide, in DeepSpeed and in ds"
)
_PIPE_TP = (
    "partitions what travels between stages across tensor-parallel ranks; a ds pipeline has no tensor axis "
    "(DeepSpeed ignores it too without one)"
)

_TP_NO_EFFECT = {
    "tensor_parallel.tp.tp_grain_size": (
        "DeepSpeed 0.19.8 does not use it in training either (its uneven-split granularity is for inference)"
    ),
    "tensor_parallel.tp.mpu": "accepted only null: ds builds the tensor-parallel group from autotp_size",
    "tensor_parallel.tp.tp_group": "accepted only null: ds builds the tensor-parallel group from autotp_size",
    "tensor_parallel.dtype": (
        "recorded by tp_model_init and not read by DeepSpeed's training engine either; the precision is "
        "fp16/bf16's"
    ),
    "tensor_parallel.injection_policy_tuple": "accepted only null (inference injection policies)",
    "tensor_parallel.replace_with_kernel_inject": "accepted only false (inference kernel injection)",
    "tensor_parallel.vocab_parallel_ce_backend": "accepted only 'torch' (ds has no Liger kernels)",
    "tensor_parallel.keep_module_on_host": (
        "ds shards the weights where the model holds them and never moves them while sharding (the engine "
        "moves the shards to the device afterwards), so the whole model is never on the device"
    ),
    "tensor_parallel.partition_config.tp_size": "replaced by autotp_size, as in DeepSpeed",
    "tensor_parallel.partition_config.embedding_partition_dim": "DeepSpeed 0.19.8 reads it nowhere",
}

NO_EFFECT: dict[str, str] = {
    "elasticity.min_time": (
        "a hint for a resource scheduler (how long a job runs before it is rescaled); DeepSpeed's runtime "
        "only checks it is >= 0, and so does ds"
    ),
    "zero_optimization.elastic_checkpoint": (
        "ds checkpoints always load at any world size (optimizer state included), so there is nothing to "
        "switch on"
    ),
    "zero_optimization.offload_optimizer.fast_init": (
        "ds writes the initial fp32 masters into the swap files a sub-group at a time whatever it says "
        "(DeepSpeed's fast_init only chooses how it fills them)"
    ),
    "zero_optimization.round_robin_gradients": (
        "in DeepSpeed it only reorders which gradients each rank copies out first during stage-2 CPU "
        "offload, to balance that copy; ds gives each rank one contiguous flat range and copies one "
        "contiguous slice per rank, so there is nothing to rebalance (values and ownership are unchanged)"
    ),
    "zero_optimization.cpu_offload_use_pin_memory": (
        "deprecated in DeepSpeed, whose 0.19.8 only warns about it; set pin_memory in offload_optimizer / "
        "offload_param instead"
    ),
    "pipeline.stages": _PIPE_MODULE_DECIDES,
    "pipeline.partition": _PIPE_MODULE_DECIDES,
    "pipeline.seed_layers": _PIPE_MODULE_DECIDES,
    "pipeline.pipe_partitioned": _PIPE_TP,
    "pipeline.grad_partitioned": _PIPE_TP,
    "pipeline.use_reentrant": (
        "ds's PipelineModule checkpoints with the function it was given (activation_checkpoint_func; by default "
        "torch's non-reentrant checkpoint), which gives the same gradients either way"
    ),
    **_TP_NO_EFFECT,
    # DeepSpeed 0.19 keys accepted only at their default or disabled value (ds_config/_compat.py)
    **compat_no_effect(),
}
"""Dotted key -> why setting it changes nothing in ds. Rendered into docs/reference/config.md; setting
one of these keys to a value other than its default warns once per load (:func:`warn_no_effect`)."""


def section_models(annotation: Any) -> list[type[BaseModel]]:
    """The section models an annotation can hold (through ``Optional``, unions and ``Annotated``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return section_models(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in section_models(arg)]
    return []


def leaf_paths(model: type[BaseModel] | None = None, prefix: str = "") -> tuple[str, ...]:
    """Dotted paths of every leaf field of ``model`` (default: the whole ``DSConfig``), sorted.

    A field that may hold several section models (``sparse_attention``'s modes) contributes the union
    of their leaves under one prefix, since the JSON path is the same whichever mode is chosen.
    """
    if model is None:
        from ._models import DSConfig

        model = DSConfig
    paths: set[str] = set()
    for name, field in model.model_fields.items():
        path = prefix + name
        sections = section_models(field.annotation)
        if not sections:
            paths.add(path)
        for section in sections:
            paths.update(leaf_paths(section, path + "."))
    return tuple(sorted(paths))


def _lookup(cfg: BaseModel, path: str) -> tuple[Any, Any] | None:
    """``(value, default)`` of the leaf at ``path``, or None where a section on the way is absent."""
    node: Any = cfg
    *sections, leaf = path.split(".")
    for name in sections:
        node = getattr(node, name, None)
        if node is None:
            return None
    field = type(node).model_fields.get(leaf)
    if field is None:  # another sparse-attention mode's key
        return None
    return getattr(node, leaf), field.get_default(call_default_factory=True)


def warn_no_effect(cfg: BaseModel) -> list[str]:
    """Warn (:class:`ConfigWarning`, once per key) for each :data:`NO_EFFECT` key set to a non-default value.

    Returns the paths warned about.
    """
    warned = []
    for path, reason in NO_EFFECT.items():
        found = _lookup(cfg, path)
        if found is None or found[0] == found[1]:
            continue
        warnings.warn(f"{path} = {found[0]!r} has no effect in ds: {reason}", ConfigWarning, stacklevel=3)
        warned.append(path)
    return warned
