"""One training case of tools/bench/bench_training.py, as it runs on each rank.

A case is one implementation (ds, ds with optimizer offload, DDP, FSDP2, DeepSpeed) at one ZeRO stage and
dtype. Every case runs the same loop: before each engine step, rank by rank, a plain forward+backward of
an identical copy of the model on the same batch is timed (the *ceiling*: no communication, no
optimizer), then the engine's step. Both sit between barriers so neither includes waiting for the other
rank. After the timed steps the copy is dropped and one more step is taken to measure memory.

Imports only torch and the standard library at module level: the same file runs in the DeepSpeed venv.
"""

from __future__ import annotations

import copy
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from _bench_memory import current_rss_bytes, live_tensor_bytes, peak_rss_bytes, reset_peak_rss
from torch import nn
from torch.profiler import record_function

LR = 1e-4
CLIP = 1.0
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class ModelDims:
    """Shape of the benchmark GPT and of its micro batch."""

    vocab: int
    width: int
    layers: int
    heads: int
    seq: int
    micro_batch: int


MODELS = {
    # the 13.3M-parameter GPT of docs/benchmarks.md
    "gpt13m": ModelDims(vocab=16_000, width=384, layers=4, heads=6, seq=256, micro_batch=4),
    # 4.2M parameters, about a sixth of gpt13m's work per step: bf16 memory checks in reasonable time
    "small": ModelDims(vocab=4_096, width=256, layers=4, heads=4, seq=128, micro_batch=4),
    # gpt13m's weights with a 16x smaller micro batch (seq 64, 2 sequences instead of 256 and 4): the
    # forward+backward shrinks about 16x while communication and the optimizer step (which scale with the
    # parameters, not the tokens) stay the same, so the engine's overhead is a larger share of the step
    # and differences between engines stand out above the noise of the ceiling
    "lean": ModelDims(vocab=16_000, width=384, layers=4, heads=6, seq=64, micro_batch=2),
    # for checking the tool itself in seconds
    "tiny": ModelDims(vocab=1_024, width=128, layers=2, heads=4, seq=64, micro_batch=2),
}


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then a 4x MLP."""

    def __init__(self, d: ModelDims) -> None:
        super().__init__()
        self.heads = d.heads
        self.ln1 = nn.LayerNorm(d.width)
        self.qkv = nn.Linear(d.width, 3 * d.width)
        self.proj = nn.Linear(d.width, d.width)
        self.ln2 = nn.LayerNorm(d.width)
        self.fc = nn.Linear(d.width, 4 * d.width)
        self.out = nn.Linear(4 * d.width, d.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v)
        )  # (B, nh, T, hs)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """GPT-2 style language model; the output head is a module tied to the token embedding, so that
    engines that gather weights per module (ZeRO-3, FSDP2) see the tied weight where it is used."""

    def __init__(self, d: ModelDims) -> None:
        super().__init__()
        self.tok = nn.Embedding(d.vocab, d.width)
        self.pos = nn.Embedding(d.seq, d.width)
        self.blocks = nn.ModuleList(Block(d) for _ in range(d.layers))
        self.ln_f = nn.LayerNorm(d.width)
        self.head = nn.Linear(d.width, d.vocab, bias=False)
        self.head.weight = self.tok.weight
        # activation checkpointing: ``checkpoint(block, x)`` runs each block (None: plain calls); set by a
        # benchmark to its implementation's own function (ds_checkpoint.activation, deepspeed.checkpointing or torch.utils)
        self.checkpoint: Any = None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))  # (B, T, C)
        for block in self.blocks:
            x = block(x) if self.checkpoint is None else self.checkpoint(block, x)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        return nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def make_model(d: ModelDims) -> GPT:
    """The same fp32 weights on every rank and in every implementation."""
    torch.manual_seed(0)
    return GPT(d)


def build_model(spec: dict, d: ModelDims) -> GPT:
    """The model as each implementation's users build it: inside ``ds_engine.zero.Init`` for ds at stage
    3 (each module is partitioned as it is constructed, so the whole model never exists on a rank), on
    the meta device for FSDP2 (its documented way: shard, then allocate only the shards, see ``_fsdp2``),
    whole on every rank otherwise (DDP and ZeRO 1/2 keep whole weights anyway)."""
    if spec["impl"] == "ds" and spec["stage"] == 3:
        import ds_engine

        with ds_engine.zero.Init(config_dict_or_path=engine_config(spec, d)):
            return make_model(d)
    if spec["impl"] == "deepspeed" and spec.get("offload") == "nvme":  # ZeRO-Infinity, as DeepSpeed's docs
        import deepspeed  # build it: each partition is written to nvme_path as its module is constructed

        with deepspeed.zero.Init(remote_device="nvme", config_dict_or_path=engine_config(spec, d)):
            return make_model(d)
    if spec["impl"] == "fsdp2":
        with torch.device("meta"):
            return make_model(d)
    return make_model(d)


def batch(d: ModelDims, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    tokens = torch.randint(0, d.vocab, (d.micro_batch, d.seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def engine_config(spec: dict, d: ModelDims) -> dict:
    """The DeepSpeed config ds and DeepSpeed both get. Clipping is explicit: DeepSpeed 0.19 defaults it to
    1.0. The offload case names the optimizer in the config so each engine builds its own offload step."""
    zero: dict[str, Any] = {"stage": spec["stage"], **spec.get("zero", {})}  # "zero": keys a run tunes
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": d.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": CLIP,
        "zero_optimization": zero,
        "bf16": {"enabled": spec["dtype"] == "bf16"},
        "steps_per_print": 10**9,
    }
    if spec.get("overlap"):
        zero["overlap_comm"] = True
    if spec.get("offload") == "nvme":  # ZeRO-Infinity: parameters and optimizer state in files (ZeRO-3)
        path = {"device": "nvme", "nvme_path": spec["nvme_path"]}
        zero["offload_param"] = {**path, **spec.get("offload_param", {})}
        zero["offload_optimizer"] = {**path, **spec.get("offload_optimizer", {})}
        config["aio"] = spec.get("aio", {})
        config["optimizer"] = {"type": "AdamW", "params": {"lr": LR}}
    elif spec.get("offload"):
        zero["offload_optimizer"] = {"device": "cpu"}
        config["optimizer"] = {"type": "AdamW", "params": {"lr": LR}}
    if spec["impl"] == "deepspeed":
        config["zero_allow_untested_optimizer"] = True  # the client torch AdamW
    return config


# (forward+backward of one micro batch, returning the loss where the implementation gives it; the update)
StepFns = tuple[Callable[[torch.Tensor, torch.Tensor], Any], Callable[[], None]]


def _engine_module(spec: dict) -> Any:
    """ds_engine, deepspeed, or None for the torch implementations."""
    if spec["impl"] == "deepspeed":
        import deepspeed

        return deepspeed
    if spec["impl"] == "ds":
        import ds_engine

        return ds_engine
    return None


def _engine(model: GPT, spec: dict, d: ModelDims) -> StepFns:
    """ds_engine or deepspeed: the same script, as a user switching the import would write it."""
    engine_module = _engine_module(spec)
    config = engine_config(spec, d)
    opt = None if "optimizer" in config else torch.optim.AdamW(model.parameters(), lr=LR)
    engine, *_ = engine_module.initialize(model=model, optimizer=opt, config=config)

    def fwd_bwd(idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        loss = engine(idx, tgt)
        engine.backward(loss)
        return loss.detach()

    return fwd_bwd, engine.step


def _torch_step(model: nn.Module, wrapped: nn.Module) -> StepFns:
    opt = torch.optim.AdamW(model.parameters(), lr=LR)

    def update() -> None:
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def fwd_bwd(idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        with record_function("phase/forward"):  # for tools/gpu/profile_zero_gpu.py; nearly free unprofiled
            loss = wrapped(idx, tgt)
        with record_function("phase/backward"):
            loss.backward()
        return loss

    return fwd_bwd, update


def _ddp(model: GPT, spec: dict, d: ModelDims) -> StepFns:
    """DDP over gloo. bf16 means a pure bf16 model (weights, grads and Adam state): DDP has no master copy."""
    model = model.to(DTYPES[spec["dtype"]])
    return _torch_step(model, nn.parallel.DistributedDataParallel(model))


def _fsdp2(model: GPT, spec: dict, d: ModelDims) -> StepFns:
    """FSDP2 (fully_shard) per block and at the root: ZeRO-3's layout. bf16 computes and reduces in bf16
    over fp32 sharded weights (the same split as a ZeRO bf16 engine's fp32 master). ``spec["device"]``
    (default ``cpu``) is the mesh's device type: fully_shard moves a host-built model's shards there."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = spec.get("device", "cpu")
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    bf16 = spec["dtype"] == "bf16"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16 else None
    kwargs = {"mesh": mesh} | ({"mp_policy": mp} if mp else {})
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    if any(p.is_meta for p in model.parameters()):  # built on meta (build_model): allocate the shards only
        model.to_empty(device=device)
        torch.manual_seed(0)
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    return _torch_step(model, model)


BUILDERS: dict[str, Callable[[GPT, dict, ModelDims], StepFns]] = {
    "ds": _engine,
    "deepspeed": _engine,
    "ddp": _ddp,
    "fsdp2": _fsdp2,
}


def run_case(rank: int, world_size: int, spec: dict) -> dict:
    """Time ``spec["steps"]`` engine steps and their ceilings on this rank, then measure memory.

    Returns per-step seconds (engine step and ceiling), live tensor bytes after the backward and after
    the step of one more step, and the peak RSS of that step.
    """
    d = MODELS[spec["model"]]
    _engine_module(spec)  # imported before the baseline, so that library size is not counted as state
    gc.collect()
    baseline_rss = current_rss_bytes()
    model = make_model(d)
    numel = sum(p.numel() for p in model.parameters())
    ceiling = copy.deepcopy(model).to(DTYPES[spec["dtype"]])  # taken before any engine wraps or shards it
    fwd_bwd, update = BUILDERS[spec["impl"]](model, spec, d)
    step_s: list[float] = []
    ceiling_s: list[float] = []
    for i in range(spec["warmup"] + spec["steps"]):
        idx, tgt = batch(d, rank, i)
        dist.barrier()
        start = time.perf_counter()
        ceiling(idx, tgt).backward()
        mid = time.perf_counter()
        ceiling.zero_grad(set_to_none=True)
        dist.barrier()  # the engine step starts together on all ranks, as in training
        begin = time.perf_counter()
        fwd_bwd(idx, tgt)
        update()
        end = time.perf_counter()
        if i >= spec["warmup"]:
            ceiling_s.append(mid - start)
            step_s.append(end - begin)

    del ceiling  # memory is the engine's alone: the copy must not be counted
    gc.collect()
    dist.barrier()
    reset_peak_rss()
    fwd_bwd(*batch(d, rank, spec["warmup"] + spec["steps"]))
    after_backward = live_tensor_bytes()
    update()
    after_step = live_tensor_bytes()
    return {
        "numel": numel,
        "step_s": step_s,
        "ceiling_s": ceiling_s,
        "live_bytes_after_backward": after_backward,
        "live_bytes_after_step": after_step,
        "peak_rss_bytes": peak_rss_bytes(),
        "baseline_rss_bytes": baseline_rss,
        "transport_calls": _transport_calls(),
    }


def _transport_calls() -> dict[str, int]:
    """Collectives that ds-zero's host transports carried in this process (which one ran the case)."""
    zero = sys.modules.get("ds_zero")
    if zero is None:
        return {}
    return {"mpi": zero.mpi_collective_calls(), "shm": zero.shm_collective_calls()}


MEMORY_KEYS = ("live_bytes_after_backward", "live_bytes_after_step", "peak_rss_bytes", "baseline_rss_bytes")


def combine_ranks(per_rank: list[dict]) -> dict:
    """A step lasts as long as its slowest rank: per-step maxima over ranks; memory of rank 0, all ranks kept."""
    return {
        "numel": per_rank[0]["numel"],
        "step_s": [max(s) for s in zip(*(r["step_s"] for r in per_rank))],
        "ceiling_s": [max(s) for s in zip(*(r["ceiling_s"] for r in per_rank))],
        **{k: per_rank[0][k] for k in MEMORY_KEYS},
        "per_rank_memory": [{k: r[k] for k in MEMORY_KEYS} for r in per_rank],
        "transport_calls": per_rank[0].get("transport_calls", {}),
    }
