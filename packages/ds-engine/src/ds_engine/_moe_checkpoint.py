"""Checkpoints of a model with ds_moe layers: every expert stored under its global index, so that a checkpoint
loads at another world size and expert-parallel degree.

In the module an expert's parameter carries its local index (``<layer>.deepspeed_moe.experts.
deepspeed_experts.<j>.<rest>``); in a checkpoint it carries its global index ``ep_rank * num_local + j``
(DeepSpeed's renaming). Weights: rank 0 writes the dense weights (``model.safetensors``) and the first rank of
each expert-data-parallel group writes the experts it holds, one file per expert (``layer_<L>_expert_<e>``).

Optimizer state stays in ds_checkpoint's flat groups, in a space every rank can describe. A group without
parameters of an ``ep_size`` > 1 layer is saved as it is. A group with them is saved as the ``ep_size``
local spaces of the expert-parallel ranks one after the other (``numel = ep_size * local numel``): expert
rank ``r`` writes its part of ``[r * numel, (r + 1) * numel)`` (at ZeRO 1/2 its piece of the partitioning
over its expert-data-parallel group); the group's parameter list names each expert once under its global
name, and each dense parameter once (at expert rank 0's copy). A range every rank of a group holds whole
(stage 0) is written by that group's first rank only. Loading matches the parameters
by global name (``LoadedState.optimizer_shard_by_name``), so the layout at load time may differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ds_checkpoint
import ds_moe
import torch
import torch.distributed as dist
from torch import nn

from ds_engine._missing import FeatureNotAvailableError

__all__ = ["ExpertNames"]

_EXPERTS = "deepspeed_moe.experts.deepspeed_experts."


def _rank(group: Any) -> int:
    return dist.get_rank(group) if group is not None and dist.is_initialized() else 0


@dataclass(frozen=True)
class _Layer:
    index: int  # the layer's place among the model's MoE layers (DeepSpeed's moe_layer_id)
    prefix: str  # "<module name>.deepspeed_moe.experts.deepspeed_experts."
    num_local: int
    num_experts: int
    ep_size: int
    ep_rank: int
    writer: bool  # the first rank of this layer's expert-data-parallel group writes its experts

    def global_index(self, local: int) -> int:
        return self.ep_rank * self.num_local + local


class ExpertNames:
    """This rank's MoE layers, and the renaming of their experts between local and global indices."""

    def __init__(self, module: nn.Module) -> None:
        self.layers: list[_Layer] = []
        for name, m in module.named_modules():
            if isinstance(m, ds_moe.MoE):
                self.layers.append(
                    _Layer(
                        index=len(self.layers),
                        prefix=f"{name}.{_EXPERTS}" if name else _EXPERTS,
                        num_local=m.num_local_experts,
                        num_experts=m.num_experts,
                        ep_size=m.ep_size,
                        ep_rank=_rank(m.deepspeed_moe.ep_group),
                        writer=_rank(m.expert_dp_group) == 0,
                    )
                )
        # the longest prefix first: a layer nested in another's expert is matched as itself
        self._by_prefix = sorted(self.layers, key=lambda layer: -len(layer.prefix))

    def split(self, name: str) -> tuple[_Layer, int, str] | None:
        """``(layer, index, rest)`` of an expert's tensor name (its index as written), None for a dense one."""
        for layer in self._by_prefix:
            if name.startswith(layer.prefix):
                index, dot, rest = name[len(layer.prefix) :].partition(".")
                if dot and index.isdigit():
                    return layer, int(index), rest
        return None

    def to_global(self, name: str) -> str:
        """The checkpoint's name of this rank's tensor ``name``."""
        hit = self.split(name)
        if hit is None:
            return name
        layer, local, rest = hit
        return f"{layer.prefix}{layer.global_index(local)}.{rest}"

    def to_local(self, name: str) -> str | None:
        """This rank's name of the checkpoint's tensor ``name``; None for an expert another rank holds. An
        expert beyond the layer's ``num_experts`` keeps its name (a strict load reports it as unexpected)."""
        hit = self.split(name)
        if hit is None:
            return name
        layer, index, rest = hit
        if index >= layer.num_experts:
            return name
        local = index - layer.ep_rank * layer.num_local
        return f"{layer.prefix}{local}.{rest}" if 0 <= local < layer.num_local else None

    # ------------------------------------------------------------------ save
    def model_files(
        self, state: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """``(dense weights, {file: expert weights})``: the experts this rank writes, one file per expert."""
        dense: dict[str, torch.Tensor] = {}
        files: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in state.items():
            hit = self.split(name)
            if hit is None:
                dense[name] = tensor
                continue
            layer, local, _ = hit
            if layer.writer:
                file = ds_checkpoint.expert_file(layer.index, layer.global_index(local))
                files.setdefault(file, {})[self.to_global(name)] = tensor
        return dense, files

    def whole_state(self, state: dict[str, torch.Tensor], group: Any) -> dict[str, torch.Tensor]:
        """The whole model's weights on rank 0 of ``group``, every expert under its global index (what an
        ep-1 copy of the model loads); a collective over ``group`` when a layer has ``ep_size`` > 1. The
        other ranks get their own part."""
        dense, files = self.model_files(state)
        mine = {name: t for tensors in files.values() for name, t in tensors.items()}
        if not any(layer.ep_size > 1 for layer in self.layers) or not dist.is_initialized():
            return {**dense, **mine}
        every: list[Any] | None = [None] * dist.get_world_size(group) if dist.get_rank(group) == 0 else None
        dist.gather_object(
            {n: t.detach().cpu() for n, t in mine.items()},
            every,
            dst=dist.get_global_rank(group, 0) if group else 0,
            group=group,
        )
        whole = dict(dense)
        for part in every or [mine]:
            whole.update(part)
        return whole

    def _group_ep(self, group: dict) -> _Layer | None:
        """A layer whose experts the optimizer group holds (all of one ``ep_size`` > 1); None for a group
        without any of an ``ep_size`` > 1 layer."""
        layers = {hit[0] for p in group["params"] if (hit := self.split(p["name"])) and hit[0].ep_size > 1}
        sizes = {layer.ep_size for layer in layers}
        if len(sizes) > 1:
            raise FeatureNotAvailableError(
                f"save_checkpoint: one optimizer parameter group holds experts of layers with ep_size "
                f"{sorted(sizes)}; ds checkpoints one expert-parallel size per group. Build the optimizer's "
                "groups with deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer"
            )
        return min(layers, key=lambda layer: layer.index) if layers else None

    def optimizer_shard(
        self, shard: tuple[dict[str, torch.Tensor], dict], dp_group: Any
    ) -> tuple[dict[str, torch.Tensor], dict] | None:
        """This rank's optimizer shard in the checkpoint's space (collective over ``dp_group``); None when this
        rank has nothing to write (another rank writes the same ranges)."""
        tensors, meta = shard
        mine = []
        dp_first = not dist.is_initialized() or dist.get_rank(dp_group) == 0
        for group in meta["groups"]:
            layer = self._group_ep(group)
            params = [{**p, "name": self.to_global(p["name"])} for p in group["params"]]
            if layer is None:  # saved as it is; a range every rank holds whole is written by the first rank
                mine.append({"ep": 1, "ep_rank": 0, "writer": dp_first, "params": params})
            else:  # the same, among the ranks holding the same experts
                mine.append(
                    {"ep": layer.ep_size, "ep_rank": layer.ep_rank, "writer": layer.writer, "params": params}
                )
        every: list[Any] = [mine]
        if dist.is_initialized() and dist.get_world_size(dp_group) > 1:
            every = [None] * dist.get_world_size(dp_group)
            dist.all_gather_object(every, mine, group=dp_group)
        out_tensors: dict[str, torch.Tensor] = {}
        groups = []
        writes = False
        for g, group in enumerate(meta["groups"]):
            local_numel = group["numel"]
            start, end = group["shard"]
            ep, ep_rank = mine[g]["ep"], mine[g]["ep_rank"]
            params: list[dict] = []
            seen: set[str] = set()
            for r in range(ep):  # one list per expert rank: the first rank's that holds that expert rank
                held = next(rank[g]["params"] for rank in every if rank[g]["ep_rank"] == r)
                for p in held:
                    if p["name"] not in seen:
                        seen.add(p["name"])
                        params.append({**p, "offset": r * local_numel + p["offset"]})
            base = ep_rank * local_numel
            if (start, end) == (0, local_numel) and not mine[g]["writer"]:
                end = start  # held whole by every rank of its group (stage 0): its first rank writes it
            writes = writes or end > start
            for key, t in tensors.items():
                if key.startswith(f"g{g}."):
                    out_tensors[key] = t[: end - start]
            groups.append(
                {**group, "numel": ep * local_numel, "shard": [base + start, base + end], "params": params}
            )
        if not writes:
            return None
        return out_tensors, {**meta, "groups": groups}

    # ------------------------------------------------------------------ load
    def model_state(self, state: ds_checkpoint.LoadedState) -> dict[str, torch.Tensor]:
        """This rank's weights from a checkpoint: the dense ones and the experts it holds, under local names."""
        wanted: dict[str, str] = {}
        for name in state.model_index():
            local = self.to_local(name)
            if local is not None:
                wanted[name] = local
        return {wanted[name]: t for name, t in state.read_model(list(wanted)).items()}

    def load_optimizer_shard(
        self, state: ds_checkpoint.LoadedState, layout: dict
    ) -> tuple[dict[str, torch.Tensor], dict]:
        """This rank's optimizer state for its ``layout`` (its ``sharded_state_dict`` meta), whatever the saved
        world size and expert-parallel degree. A group keeps its own ``name`` and ``moe`` options (they
        carry the ``ep_size`` it was built for)."""
        tensors, meta = state.optimizer_shard_by_name(layout, saved_name=self.to_global)
        for now, loaded in zip(layout["groups"], meta["groups"], strict=True):
            hparams = dict(loaded.get("hparams", {}))
            for key in ("name", "moe"):
                if key in now.get("hparams", {}):
                    hparams[key] = now["hparams"][key]
                else:
                    hparams.pop(key, None)
            loaded["hparams"] = hparams
        return tensors, meta
