"""AutoTP training: split a model's linear layers over a tensor-parallel group, checking first.

Every check runs before any layer is replaced, so a model AutoTP cannot split is left as it was and the
one error names the module and the numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from ._layers import ColumnParallelLinear, RowParallelLinear
from ._plan import Spec, find_spec, hf_plan, resolve_specs
from ._vocab import (
    VocabParallelCausalLMLoss,
    VocabParallelEmbedding,
    VocabParallelLinear,
    embedding_problem,
    install_vocab_parallel_loss,
)

__all__ = ["ShardPlan", "TensorParallelError", "shard_model", "tp_group_of"]

logger = logging.getLogger("ds_tpsp")

_GROUP_ATTR = "ds_tp_group"
_LM_HEAD_NAMES = ("lm_head", "embed_out")  # DeepSpeed's default lm_head_patterns
# Hugging Face config attributes: (heads, the projections whose output features hold them)
_HEAD_COUNTS = (("num_attention_heads", ("q_proj",)), ("num_key_value_heads", ("k_proj", "v_proj")))


class TensorParallelError(ValueError):
    """The model, its sizes or the degree do not allow the tensor-parallel split asked for."""


@dataclass
class ShardPlan:
    """What :func:`shard_model` did: each split linear layer's name and kind, and where the rules came from."""

    degree: int
    source: str
    # module name -> "column" | "column+gather" | "row" | "vocab" (the head, vocab_parallel_lm_head) | "vocab-embedding"
    layers: dict[str, str] = field(default_factory=dict)
    grad_allreduce: list[str] = field(default_factory=list)  # whole weights whose gradient is summed
    replaced: dict[int, nn.Parameter] = field(default_factory=dict)  # id(whole parameter) -> its shard

    def remap(self, params: Any) -> list:
        """``params`` (parameters, or optimizer param-group dicts) with each whole parameter that was split
        replaced by its shard: an optimizer built before the split then steps the shards."""
        out = []
        for p in params:
            if isinstance(p, dict):
                p = {**p, "params": [self.replaced.get(id(q), q) for q in p["params"]]}
            else:
                p = self.replaced.get(id(p), p)
            out.append(p)
        return out

    def remap_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Point a torch optimizer built before the split (with no state yet) at the shards, in place."""
        for group in optimizer.param_groups:
            group["params"] = [self.replaced.get(id(q), q) for q in group["params"]]


def tp_group_of(model: nn.Module) -> ProcessGroup | None:
    """The tensor-parallel group ``model`` was split over (None: not split)."""
    return getattr(model, _GROUP_ATTR, None)


def shard_model(
    model: nn.Module,
    group: ProcessGroup | DeviceMesh,
    config: Any = None,
    *,
    partition_config: Any = None,
    preset_model: str | None = None,
    overlap_comm: bool = False,
    vocab_parallel_lm_head: bool | None = None,
) -> ShardPlan:
    """Split ``model``'s linear layers over ``group`` (a process group or a 1-D DeviceMesh), in place.

    ``config`` is ds_config's ``TensorParallelConfig`` (its keys win over the keyword arguments, which
    serve callers without a config). Every rank of the group must call it with the same model; the group's
    first rank's weights are the ones split.
    """
    if isinstance(group, DeviceMesh):
        group = group.get_group()
    degree = dist.get_world_size(group)
    if config is not None:
        if config.autotp_size not in (0, 1, degree):
            raise TensorParallelError(
                f"tensor_parallel.autotp_size is {config.autotp_size} but the tensor-parallel group has {degree} "
                "ranks; build the group from autotp_size"
            )
        partition_config, preset_model = config.partition_config, config.preset_model
        overlap_comm, vocab_parallel_lm_head = config.tp_overlap_comm, config.vocab_parallel_lm_head
    specs, source = resolve_specs(model, partition_config, preset_model)
    plan = ShardPlan(degree, source)
    if degree == 1:
        return plan
    patterns = tuple(partition_config.lm_head_patterns) if partition_config is not None else _LM_HEAD_NAMES
    head = _vocab_head(model, patterns, degree, vocab_parallel_lm_head, source)
    strict = partition_config is not None and partition_config.strict_mode
    chosen = _choose(model, specs, strict, skip=head[0] if head else None)
    if not any(spec.kind != "skip" for _, _, spec in chosen) and head is None:
        raise TensorParallelError(
            f"AutoTP found no linear layer to split in {type(model).__name__} (rules from {source}); give "
            "tensor_parallel.partition_config.layer_specs naming its projections, or train it without "
            "tensor_parallel.autotp_size"
        )
    for name, linear, spec in chosen:
        _check_sizes(name, linear, spec, degree)
    _check_heads(model, chosen, degree)

    _broadcast_from_first(model, group)
    for name, linear, spec in chosen:
        if spec.kind == "skip":
            if spec.grad_allreduce:
                for p in linear.parameters():
                    p.register_hook(_summed_over(group))
                plan.grad_allreduce.append(name)
            continue
        sizes = _sub_sizes(linear, spec)
        if spec.kind == "column":
            new: nn.Module = ColumnParallelLinear(
                linear, group, sub_sizes=sizes, gather_output=spec.gather_output, overlap_comm=overlap_comm
            )
            plan.layers[name] = "column+gather" if spec.gather_output else "column"
        else:
            new = RowParallelLinear(linear, group, sub_sizes=sizes)
            plan.layers[name] = "row"
        plan.replaced[id(linear.weight)] = new.weight
        if linear.bias is not None:
            plan.replaced[id(linear.bias)] = new.bias
        _replace(model, name, new)
    if head is not None:
        _split_vocab_head(model, plan, group, overlap_comm, *head)
    setattr(model, _GROUP_ATTR, group)
    model.ds_autotp_parsed = True  # DeepSpeed's marker
    return plan


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def _vocab_head(
    model: nn.Module, patterns: tuple[str, ...], degree: int, asked: bool | None, source: str
) -> tuple[str, nn.Linear, list[tuple[str, nn.Embedding]]] | None:
    """The LM head to split over the vocabulary, with the embeddings tied to it; None: the head is not split
    so. ``asked`` is ``vocab_parallel_lm_head``: true splits it (or raises, naming why it cannot); null does
    when the model's Hugging Face plan shards the embedding (``embedding_rowwise``) and the head is tied to it,
    falling back to a whole head with a warning when it cannot (DeepSpeed 0.19.8's rules)."""
    if asked is False:
        return None
    embeddings: dict[int, list[tuple[str, nn.Embedding]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, nn.Embedding):
            embeddings.setdefault(id(module.weight), []).append((name, module))
    heads = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name.rpartition(".")[2] in patterns
    ]
    if asked is None:
        plan_shards_embedding = source == "the model's Hugging Face tp_plan" and any(
            style.lower() == "embedding_rowwise" for style in hf_plan(model).values()
        )
        if not (plan_shards_embedding and any(id(m.weight) in embeddings for _, m in heads)):
            return None
    try:
        if not heads:
            raise TensorParallelError(
                f"tensor_parallel.vocab_parallel_lm_head needs the LM head: an nn.Linear named one of "
                f"{list(patterns)} (tensor_parallel.partition_config.lm_head_patterns); {type(model).__name__} "
                "has none"
            )
        if len(heads) > 1:
            raise TensorParallelError(
                f"tensor_parallel.vocab_parallel_lm_head: {type(model).__name__} has several LM heads "
                f"{[n for n, _ in heads]}; name the one in tensor_parallel.partition_config.lm_head_patterns"
            )
        name, linear = heads[0]
        if linear.out_features % degree:
            raise TensorParallelError(
                f"AutoTP cannot split {name} over the vocabulary on {degree} ranks "
                f"(tensor_parallel.vocab_parallel_lm_head): its {linear.out_features} vocabulary rows are not "
                f"divisible by tensor_parallel.autotp_size {degree} (ds splits the vocabulary evenly); pad the "
                "vocabulary or set vocab_parallel_lm_head false"
            )
        tied = embeddings.get(id(linear.weight), [])
        for ename, emb in tied:
            problem = embedding_problem(emb)
            if problem:
                raise TensorParallelError(
                    f"tensor_parallel.vocab_parallel_lm_head: the embedding {ename} tied to {name} cannot look up "
                    f"a vocabulary shard: {problem}"
                )
        problem = install_vocab_parallel_loss(model, object(), check_only=True)
        if problem:
            raise TensorParallelError(
                f"tensor_parallel.vocab_parallel_lm_head: {problem}; the split logits need the vocab-parallel "
                "loss there. Set vocab_parallel_lm_head false to gather the logits"
            )
    except TensorParallelError as exc:
        if asked:
            raise
        logger.warning("AutoTP: the LM head and its tied embedding stay whole (%s)", exc)
        return None
    return name, linear, tied


def _split_vocab_head(
    model: nn.Module,
    plan: ShardPlan,
    group: ProcessGroup,
    overlap_comm: bool,
    name: str,
    linear: nn.Linear,
    tied: list[tuple[str, nn.Embedding]],
) -> None:
    """The head split over the vocabulary with its logits left split, its tied embeddings looking up the same
    shard, and the model's loss computed from the split logits."""
    head = VocabParallelLinear(linear, group, overlap_comm=overlap_comm)
    plan.layers[name] = "vocab"
    plan.replaced[id(linear.weight)] = head.weight
    if linear.bias is not None:
        plan.replaced[id(linear.bias)] = head.bias
    _replace(model, name, head)
    for ename, emb in tied:
        _replace(model, ename, VocabParallelEmbedding(emb, head))
        plan.layers[ename] = "vocab-embedding"
    install_vocab_parallel_loss(model, VocabParallelCausalLMLoss(head))


def _choose(
    model: nn.Module, specs: tuple[Spec, ...], strict: bool, skip: str | None = None
) -> list[tuple[str, nn.Linear, Spec]]:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    # a head tied to the embedding stays whole with it (DeepSpeed keeps a tied pair replicated too)
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    chosen = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or id(module.weight) in embedded or name == skip:
            continue
        spec = find_spec(specs, name + ".weight", model_type)
        if spec is None:
            if strict:
                raise TensorParallelError(
                    f"tensor_parallel.partition_config.strict_mode: no layer spec matches {name}.weight "
                    f"({module.in_features} -> {module.out_features}); add a spec for it (partition_type "
                    "'skip' keeps it whole)"
                )
            continue
        chosen.append((name, module, spec))
    return chosen


def _sub_sizes(linear: nn.Linear, spec: Spec) -> tuple[int, ...] | None:
    dim = 0 if spec.kind == "column" else 1
    if spec.shape is None:
        return None
    full = linear.weight.shape[dim]
    entry = spec.shape[dim] if len(spec.shape) == 2 else None
    if isinstance(entry, tuple):
        return tuple(entry)
    if isinstance(entry, int) and entry > 0:
        return (full // entry,) * entry
    return None


def _check_sizes(name: str, linear: nn.Linear, spec: Spec, degree: int) -> None:
    if spec.kind == "skip":
        return
    dim = 0 if spec.kind == "column" else 1
    if spec.partition_dim not in (None, dim) or (spec.shape is not None and len(spec.shape) != 2):
        raise TensorParallelError(
            f"{name}: a {spec.kind} split along dimension {spec.partition_dim} with shape {spec.shape} is not "
            f"available in ds (it splits a 2-D weight along dimension {dim}, optionally as equal or listed "
            "sub-weights); change the layer spec"
        )
    what = "output" if dim == 0 else "input"
    full = linear.weight.shape[dim]
    entry = spec.shape[dim] if spec.shape is not None else None
    if isinstance(entry, tuple) and sum(entry) != full:
        raise TensorParallelError(
            f"{name}: the sub-weight sizes {list(entry)} do not add up to its {full} {what} features"
        )
    if isinstance(entry, int) and entry > 0 and full % entry:
        raise TensorParallelError(
            f"{name}: its {full} {what} features do not split into {entry} equal sub-weights"
        )
    for size in _sub_sizes(linear, spec) or (full,):
        if size % degree:
            raise TensorParallelError(
                f"AutoTP cannot split {name} {spec.kind}-wise over {degree} ranks: its {what} features "
                f"({size}) are not divisible by tensor_parallel.autotp_size {degree}; pick an autotp_size that "
                f"divides {size}"
            )


def _check_heads(model: nn.Module, chosen: list[tuple[str, nn.Linear, Spec]], degree: int) -> None:
    """Attention heads must split evenly: a rank holding part of a head would compute a wrong softmax."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    for attr, projections in _HEAD_COUNTS:
        heads = getattr(config, attr, None)
        if not isinstance(heads, int) or heads % degree == 0:
            continue
        for name, _, spec in chosen:
            if spec.kind == "column" and name.rpartition(".")[2] in projections:
                raise TensorParallelError(
                    f"AutoTP cannot split {name.rpartition('.')[0]} over {degree} ranks: {attr} ({heads}) is not "
                    f"divisible by tensor_parallel.autotp_size {degree}; pick an autotp_size among "
                    f"{[d for d in range(1, heads + 1) if heads % d == 0]}"
                )


def _broadcast_from_first(model: nn.Module, group: ProcessGroup) -> None:
    """Every rank of the group splits the same weights: the group's first rank's."""
    src = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, src=src, group=group)


def _summed_over(group: ProcessGroup):
    def hook(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad, group=group)
        return grad

    return hook
