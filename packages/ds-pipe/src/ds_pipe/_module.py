"""``PipelineModule``: a model given as a list of layers, of which each rank builds its stage's share."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint as _torch_checkpoint

from ds_pipe._partition import partition_balanced, partition_uniform
from ds_pipe._topology import PipeDataParallelTopology, ProcessTopology

__all__ = ["LayerSpec", "PipelineError", "PipelineModule", "TiedLayerSpec"]


class PipelineError(Exception):
    """A misuse of a pipeline (DeepSpeed's class of the same name)."""


class LayerSpec:
    """A layer not built yet: ``typename(*module_args, **module_kwargs)``, built only on the stage that owns it."""

    def __init__(self, typename: type, *module_args: Any, **module_kwargs: Any) -> None:
        if not (isinstance(typename, type) and issubclass(typename, nn.Module)):
            raise RuntimeError("LayerSpec only supports torch.nn.Module types.")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs
        self.global_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else -1

    def __repr__(self) -> str:
        args = [repr(a) for a in self.module_args] + [f"{k}={v!r}" for k, v in self.module_kwargs.items()]
        return f"{self.typename.__name__}({', '.join(args)})"

    def build(self, log: bool = False) -> nn.Module:
        return self.typename(*self.module_args, **self.module_kwargs)


class TiedLayerSpec(LayerSpec):
    """A layer whose weights (``tied_weight_attr``) are shared by every layer of the same ``key``: one module
    per stage holding the key, kept equal by summing their gradients over those stages."""

    def __init__(
        self,
        key: str,
        typename: type,
        *module_args: Any,
        forward_fn: Callable | None = None,
        tied_weight_attr: str | list[str] = "weight",
        **module_kwargs: Any,
    ) -> None:
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = (
            [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)
        )


def _set_random_seed(seed: int) -> None:
    """Python's, NumPy's (when installed) and torch's generators, as DeepSpeed's ``set_random_seed``."""
    random.seed(seed)
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with torch in practice
        pass
    else:
        numpy.random.seed(seed)
    torch.manual_seed(seed)


def _layer_name(layer: Any) -> str | None:
    if isinstance(layer, LayerSpec):
        return layer.typename.__name__
    if isinstance(layer, nn.Module):
        return layer.__class__.__name__
    return getattr(layer, "__name__", None)


class PipelineModule(nn.Module):
    """DeepSpeed's ``PipelineModule``: ``layers`` (modules, ``LayerSpec``s, callables) split into
    ``num_stages`` stages by ``partition_method``; this rank builds only its stage's layers.

    The stage is this rank's ``pipe`` coordinate in ``topology`` (DeepSpeed's ``PipeDataParallelTopology``
    of ``num_stages`` x the rest when only ``num_stages`` is given). No process group is made here: the
    engine hands the groups over (:meth:`attach_groups`) when ``initialize()`` builds the job's topology.
    """

    def __init__(
        self,
        layers: Iterable[Any],
        num_stages: int | None = None,
        topology: ProcessTopology | None = None,
        loss_fn: Callable | None = None,
        seed_layers: bool = False,
        seed_fn: Callable[[int], None] | None = None,
        base_seed: int = 1234,
        partition_method: str = "parameters",
        activation_checkpoint_interval: int = 0,
        activation_checkpoint_func: Callable | None = None,
        checkpointable_layers: list[str] | None = None,
        dynamic_shape: bool = False,
    ) -> None:
        super().__init__()
        if num_stages is None and topology is None:
            raise RuntimeError("must provide num_stages or topology")
        if checkpointable_layers is not None and not isinstance(checkpointable_layers, list):
            raise TypeError("param `checkpointable_layers` must be type of list.")
        self.loss_fn = loss_fn
        self.seed_layers = seed_layers
        self.seed_fn = seed_fn
        self.base_seed = base_seed
        self.checkpointable_layers = checkpointable_layers
        self.activation_checkpoint_interval = activation_checkpoint_interval
        self.activation_checkpoint_func = activation_checkpoint_func or partial(
            _torch_checkpoint, use_reentrant=False
        )
        self.dynamic_shape = dynamic_shape
        self.micro_offset = 0
        initialized = dist.is_available() and dist.is_initialized()
        self.global_rank = dist.get_rank() if initialized else 0
        self.world_size = dist.get_world_size() if initialized else 1
        if topology is None:
            assert num_stages is not None
            if self.world_size % num_stages != 0:
                raise RuntimeError(
                    f"num_stages ({num_stages}) must divide distributed world size ({self.world_size})"
                )
            topology = PipeDataParallelTopology(num_pp=num_stages, num_dp=self.world_size // num_stages)
        if topology.world_size() != self.world_size:
            raise RuntimeError(
                f"the pipeline topology spans {topology.world_size()} ranks ({topology.axes} = "
                f"{topology.dims}) but the job has {self.world_size}: call deepspeed.init_distributed() "
                "before building the PipelineModule, and size the topology to the world"
            )
        self._topo = topology
        self.num_stages = topology.get_dim("pipe")
        self.stage_id = topology.get_coord(self.global_rank).pipe
        self._layer_specs = list(layers)
        self._num_layers = len(self._layer_specs)
        if self._num_layers < self.num_stages:
            raise PipelineError(
                f"{self.num_stages} pipeline stages but only {self._num_layers} layers: stage "
                f"{self._num_layers} and later would hold no layer. Use at most {self._num_layers} stages "
                "(num_stages / the topology's pipe axis), or split the model into more layers"
            )
        self.parts = self._partition(partition_method)
        self._local_start = self.parts[self.stage_id]
        self._local_stop = self.parts[self.stage_id + 1]
        self.forward_funcs: list[Any] = []
        self.fwd_map: dict[str, int] = {}
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs: dict[str, list[str]] = {}
        self._build()
        self.tied_comms: dict[str, dict[str, Any]] = {}
        self._grid: Any = None

    # ------------------------------------------------------------------ partitioning and building
    def _partition(self, method: str) -> list[int]:
        method = method.lower()
        if method == "uniform":
            return partition_uniform(self._num_layers, self.num_stages)
        if method == "parameters":
            return partition_balanced(self._count_layer_params(), self.num_stages)
        if method.startswith("type:"):
            hits = set(self._find_layer_type(method.split(":", 1)[1]))
            return partition_balanced(
                [1 if i in hits else 0 for i in range(self._num_layers)], self.num_stages
            )
        raise NotImplementedError(f"Partitioning method {method} not implemented.")

    def _count_layer_params(self) -> list[int]:
        """Trainable parameters per layer; a ``LayerSpec`` is built to count (as DeepSpeed does, which also
        draws from the random generators: layers built later see the same generator state)."""
        counts = []
        for layer in self._layer_specs:
            module = layer.build() if isinstance(layer, LayerSpec) else layer
            params = module.parameters() if isinstance(module, nn.Module) else ()
            counts.append(sum(p.numel() for p in params if p.requires_grad))
        return counts

    def _find_layer_type(self, pattern: str) -> list[int]:
        regex = re.compile(pattern, re.IGNORECASE)
        idxs = [
            i for i, layer in enumerate(self._layer_specs) if (n := _layer_name(layer)) and regex.search(n)
        ]
        if not idxs:
            raise RuntimeError(f"Partitioning '{pattern}' found no valid layers to partition.")
        return idxs

    def _build(self) -> None:
        for idx in range(self._local_start, self._local_stop):
            layer = self._layer_specs[idx]
            if self.seed_layers:
                (self.seed_fn or _set_random_seed)(self.base_seed + idx)
            if isinstance(layer, PipelineModule):
                raise NotImplementedError("RECURSIVE BUILD NOT YET IMPLEMENTED")
            if isinstance(layer, nn.Module):
                self._add_layer(idx, layer)
            elif isinstance(layer, TiedLayerSpec):
                if layer.key not in self.tied_modules:
                    self.tied_modules[layer.key] = layer.build()
                    self.tied_weight_attrs[layer.key] = layer.tied_weight_attr
                module = self.tied_modules[layer.key]
                self.forward_funcs.append(
                    module if layer.forward_fn is None else partial(layer.forward_fn, module)
                )
            elif isinstance(layer, LayerSpec):
                self._add_layer(idx, layer.build())
            else:  # a function (a lambda): called in forward, nothing to build
                self.forward_funcs.append(layer)
        for p in self.parameters():
            p.ds_pipe_replicated = False

    def _add_layer(self, idx: int, module: nn.Module) -> None:
        self.forward_funcs.append(module)
        self.fwd_map[str(idx)] = len(self.forward_funcs) - 1
        self.add_module(str(idx), module)

    # ------------------------------------------------------------------ forward
    def forward(self, forward_input: Any) -> Any:
        """This stage's layers in order; with ``activation_checkpoint_interval`` each run of that many
        layers is recomputed in backward (runs holding no parameter, or not in ``checkpointable_layers``, are not)."""
        self.micro_offset += 1
        interval = self.activation_checkpoint_interval
        n = len(self.forward_funcs)
        if interval == 0:
            return self._range_func(0, n)(forward_input)
        x = forward_input
        for start in range(0, n, interval):
            end = min(start + interval, n)
            args = x if isinstance(x, tuple) else (x,)
            if self._is_checkpointable(self.forward_funcs[start:end]):
                x = self.activation_checkpoint_func(self._range_func(start, end), *args)
            else:
                x = self._range_func(start, end)(*args)
        return x

    def _range_func(self, start: int, end: int) -> Callable:
        offset = self.micro_offset + 1

        def run(*inputs: Any) -> Any:
            x = inputs[0] if len(inputs) == 1 else inputs
            for i, layer in enumerate(self.forward_funcs[start:end]):
                self.curr_layer = start + i + self._local_start
                if self.seed_layers:
                    (self.seed_fn or _set_random_seed)(self.base_seed * offset + self.curr_layer)
                x = layer(x)
            return x

        return run

    def _is_checkpointable(self, funcs: list[Any]) -> bool:
        if self.checkpointable_layers is not None:
            return all(f.__class__.__name__ in self.checkpointable_layers for f in funcs)
        return any(any(True for _ in f.parameters()) for f in funcs if isinstance(f, nn.Module))

    # ------------------------------------------------------------------ DeepSpeed's accessors
    def partitions(self) -> list[int]:
        return self.parts

    def stage_owner(self, layer_idx: int) -> int:
        if not 0 <= layer_idx < self._num_layers:
            raise ValueError(f"layer {layer_idx} out of range: the model has {self._num_layers} layers")
        for stage in range(self.num_stages):
            if self.parts[stage] <= layer_idx < self.parts[stage + 1]:
                return stage
        raise RuntimeError(f"Layer {layer_idx} not owned? parts={self.parts}")

    def layer_range(self) -> tuple[int, int]:
        """The global indices ``[start, stop)`` of this stage's layers."""
        return self._local_start, self._local_stop

    def layer_name(self, idx: int) -> str:
        """A layer named for error messages: ``layer 3 (Linear)``."""
        return f"layer {idx} ({_layer_name(self._layer_specs[idx]) or type(self._layer_specs[idx]).__name__})"

    def set_checkpoint_interval(self, interval: int) -> None:
        if interval < 0:
            raise ValueError(f"activation checkpoint interval must be >= 0, got {interval}")
        self.activation_checkpoint_interval = interval

    def topology(self) -> ProcessTopology:
        return self._topo

    def mpu(self) -> Any:
        """The grid (DeepSpeed's model-parallel unit), once the engine has attached the groups."""
        return self._grid

    def num_pipeline_stages(self) -> int:
        return self.num_stages

    def tied_keys(self) -> dict[str, list[int]]:
        """Each tied key and the stages that hold it, sorted by key (the order every rank agrees on)."""
        keys = sorted({s.key for s in self._layer_specs if isinstance(s, TiedLayerSpec)})
        return {
            k: sorted(
                {
                    self.stage_owner(i)
                    for i, s in enumerate(self._layer_specs)
                    if isinstance(s, TiedLayerSpec) and s.key == k
                }
            )
            for k in keys
        }

    def tied_weights(self, key: str) -> list[torch.Tensor]:
        module = self.tied_modules[key]
        out = []
        for attr in self.tied_weight_attrs[key]:
            w: Any = module
            for part in attr.split("."):
                w = getattr(w, part)
            out.append(w)
        return out

    def attach_groups(self, grid: Any, tied_comms: dict[str, dict[str, Any]]) -> None:
        """Take the grid and the groups of the tied keys this stage holds (``{key: {"ranks", "group"}}``),
        and make the tied copies equal to the first holder's. Tied copies on later stages are marked
        ``ds_pipe_replicated`` (counted once in the gradient norm)."""
        self._grid = grid
        self.tied_comms = tied_comms
        for key, comm in tied_comms.items():
            if self.global_rank != comm["ranks"][0]:
                for p in self.tied_modules[key].parameters():
                    p.ds_pipe_replicated = True
        self.synchronize_tied_weights()

    def synchronize_tied_weights(self) -> None:
        with torch.no_grad():
            for comm in self.tied_comms.values():
                for w in self.tied_weights_of(comm):
                    dist.broadcast(w, src=comm["ranks"][0], group=comm["group"])

    def tied_weights_of(self, comm: dict[str, Any]) -> list[torch.Tensor]:
        return self.tied_weights(comm["key"])

    def allreduce_tied_weight_gradients(self) -> None:
        """Sum each tied weight's gradient over the stages that hold it."""
        for comm in self.tied_comms.values():
            for w in self.tied_weights_of(comm):
                if w.grad is None and w.requires_grad:  # this stage's copy got none: it adds zeros, and
                    w.grad = torch.zeros_like(w)  # every holder takes part in the same collectives
                if w.grad is not None:
                    dist.all_reduce(w.grad, group=comm["group"])

    def get_tied_weights_and_groups(self) -> list[tuple[torch.Tensor, Any]]:
        return [(w, comm["group"]) for comm in self.tied_comms.values() for w in self.tied_weights_of(comm)]
