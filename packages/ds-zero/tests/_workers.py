"""Module-level worker functions run by rank_testing.spawn (real processes, gloo)."""

from __future__ import annotations

import copy
import math

import torch
from ds_zero import GradientReducer, ZeroOptimizer, ZeroOptions, names_of
from torch import nn

GAS = 2
STEPS = 3
MICRO_BATCH = 2  # samples per rank per micro-step


class HalvingScaler:
    """A small real loss scaler: fixed start, halves on overflow, records every update."""

    def __init__(self, scale: float = 1024.0) -> None:
        self._scale = scale
        self.updates: list[bool] = []

    @property
    def loss_scale(self) -> float:
        return self._scale

    def update_scale(self, overflow: bool) -> None:
        self.updates.append(overflow)
        if overflow:
            self._scale = max(self._scale / 2, 1.0)

    def state_dict(self) -> dict:
        return {"scale": self._scale, "updates": list(self.updates)}

    def load_state_dict(self, state: dict) -> None:
        self._scale = state["scale"]
        self.updates = list(state["updates"])


class Tiny(nn.Module):
    """Uneven sizes on purpose: 131 trainable elements, a frozen layer, a layer that never gets grads."""

    def __init__(self, sparse_emb: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 5, sparse=sparse_emb)
        self.l1 = nn.Linear(5, 7)
        self.frozen = nn.Linear(7, 7)
        self.frozen.requires_grad_(False)
        self.l2 = nn.Linear(7, 3)
        self.unused = nn.Linear(3, 3)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx).mean(1)  # (B, 5)
        h = torch.tanh(self.l1(h))
        return self.l2(self.frozen(h))  # (B, 3)


def make_data(world: int, steps: int = STEPS, seed: int = 1):
    """Global batches: [step][micro] -> (idx (world*MB, 4), target (world*MB,))."""
    g = torch.Generator().manual_seed(seed)
    n = world * MICRO_BATCH
    return [
        [
            (torch.randint(0, 11, (n, 4), generator=g), torch.randint(0, 3, (n,), generator=g))
            for _ in range(GAS)
        ]
        for _ in range(steps)
    ]


def make_optimizer(kind: str, params):
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.05, weight_decay=0.01)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.3, momentum=0.9)
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=0.1)
    raise ValueError(kind)


def param_groups(model: nn.Module):
    """Two groups (different lr) including a frozen parameter, as users write them."""
    first = [model.emb.weight, model.l1.weight, model.l1.bias, model.frozen.weight]
    rest = [
        p
        for n, p in model.named_parameters()
        if not (n.startswith("emb") or n.startswith("l1")) and p is not model.frozen.weight
    ]
    return [{"params": first}, {"params": rest, "lr": 0.02}]


def reference(cfg: dict, world: int, data) -> dict[str, torch.Tensor]:
    """Single process on the concatenated batch: the weights every configuration must reproduce."""
    torch.manual_seed(0)
    model = Tiny()
    opt = make_optimizer(cfg.get("optim", "adam"), param_groups(model))
    for step in data:
        for idx, tgt in step:
            loss = nn.functional.cross_entropy(model(idx), tgt) / GAS
            loss.backward()
        for p in model.parameters():  # data parallel treats a missing grad as zeros, on every rank
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        if cfg.get("clip", 0.0) > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _my_slice(rank: int, idx: torch.Tensor, tgt: torch.Tensor):
    sl = slice(rank * MICRO_BATCH, (rank + 1) * MICRO_BATCH)
    return idx[sl], tgt[sl]


def build_zero(cfg: dict, model: nn.Module, scaler=None) -> ZeroOptimizer:
    opt = make_optimizer(cfg.get("optim", "adam"), param_groups(model))
    keys = (
        "reduce_bucket_size",
        "allgather_bucket_size",
        "overlap_comm",
        "reduce_scatter",
        "contiguous_gradients",
        "allgather_partitions",
        "cpu_offload",
        "gradient_predivide_factor",
        "prescale_gradients",
        "grad_accum_dtype",
    )
    kwargs = {k: cfg[k] for k in keys if k in cfg}
    options = ZeroOptions(stage=cfg["stage"], clip_grad=cfg.get("clip", 0.0), **kwargs)
    return ZeroOptimizer(opt, options, scaler=scaler, param_names=names_of(model))


def train_zero(rank: int, cfg: dict, data, model: nn.Module | None = None, zero=None):
    if model is None:
        torch.manual_seed(0)
        model = Tiny().to(cfg.get("dtype", torch.float32))
        zero = build_zero(cfg, model, HalvingScaler() if cfg.get("scaler") else None)
    for step in data:
        for m, (idx, tgt) in enumerate(step):
            if not cfg.get("no_boundary"):  # without set_boundary stage 1 reduces everything in step()
                zero.set_boundary(m == GAS - 1)
            i, t = _my_slice(rank, idx, tgt)
            loss = nn.functional.cross_entropy(model(i).float(), t) / GAS
            zero.backward(loss)
        assert zero.step(), "unexpected overflow"
    return model, zero


def train_stage0(rank: int, cfg: dict, data) -> nn.Module:
    torch.manual_seed(0)
    model = Tiny(sparse_emb=cfg.get("sparse_emb", False))
    opt = make_optimizer(cfg.get("optim", "adam"), param_groups(model))
    reducer = GradientReducer(
        model,
        bucket_size_elems=cfg.get("reduce_bucket_size", 40),
        fp32_allreduce=cfg.get("fp32_allreduce", False),
        prescale_gradients=cfg.get("prescale_gradients", False),
        gradient_predivide_factor=cfg.get("gradient_predivide_factor", 1.0),
        sparse_gradients=cfg.get("sparse_gradients", False),
        overlap_comm=cfg.get("overlap_comm", False),
    )
    for step in data:
        for m, (idx, tgt) in enumerate(step):
            reducer.set_boundary(m == GAS - 1)
            i, t = _my_slice(rank, idx, tgt)
            (nn.functional.cross_entropy(model(i), t) / GAS).backward()
        reducer.reduce()
        for p in model.parameters():
            if p.grad is not None and p.grad.is_sparse:
                p.grad = p.grad.to_dense()
        if cfg.get("clip", 0.0) > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
        opt.step()
        opt.zero_grad()
    return model


def max_diff(model: nn.Module, ref: dict[str, torch.Tensor]) -> float:
    return max(float((v.float() - ref[k].float()).abs().max()) for k, v in model.state_dict().items())


def memory_check(rank: int, world: int) -> list[dict]:
    """Optimizer-state bytes against the ZeRO formula on a model big enough that scalars are noise."""
    results = []
    for stage in (1, 2):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(33, 31), nn.Linear(31, 17))
        zero = ZeroOptimizer(
            torch.optim.Adam(model.parameters()), ZeroOptions(stage=stage, reduce_bucket_size=200)
        )
        for _ in range(GAS):
            zero.backward(model(torch.randn(2, 33)).square().mean())
        zero.step()
        numel = sum(p.numel() for p in model.parameters())
        padded = -(-numel // (2 * world)) * 2 * world
        rep = zero.memory_report()
        results.append(
            {
                "stage": stage,
                "state_bytes": rep.optimizer_state_bytes,
                "formula_bytes": 2 * 4 * padded // world,
                "grad_bytes": rep.grad_bytes,
                "numel": numel,
                "master_bytes": rep.master_param_bytes,
            }
        )
        zero.remove_hooks()
    return results


def overflow_check(rank: int, world: int) -> dict:
    """An inf on one rank's gradient skips the step on every rank and halves the scale once."""
    torch.manual_seed(0)
    model = Tiny()
    zero = build_zero({"stage": 2, "reduce_bucket_size": 30}, model, HalvingScaler())
    before = copy.deepcopy(model.state_dict())
    idx = torch.randint(0, 11, (2, 4))
    loss = nn.functional.cross_entropy(model(idx), torch.zeros(2, dtype=torch.long))
    if rank == world - 1:
        loss = loss * math.inf
    zero.backward(loss)
    stepped = zero.step()
    return {
        "stepped": stepped,
        "updates": zero.scaler.updates,
        "scale": zero.scaler.loss_scale,
        "unchanged": max_diff(model, before) == 0.0,
        "skipped": zero.skipped_steps,
    }


def save_state(rank: int, world: int, cfg: dict):
    """Train two steps, snapshot model + shard, train two more: the continuation every reload must match."""
    data = make_data(world, steps=4, seed=5)
    model, zero = train_zero(rank, cfg, data[:2])
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    tensors, meta = zero.sharded_state_dict()
    train_zero(rank, cfg, data[2:], model, zero)
    return {
        "model": snapshot,
        "tensors": tensors,
        "meta": meta,
        "final": model.state_dict(),
        "scaler": zero.scaler.state_dict() if zero.scaler else None,
    }


def load_state(rank: int, world: int, cfg: dict, saved: dict, full: dict[str, torch.Tensor]):
    """Load the concatenated state, slice this rank's part of the NEW layout, continue two steps."""
    torch.manual_seed(123)  # different init: everything must come from the checkpoint
    model = Tiny()
    model.load_state_dict(saved["model"])
    zero = build_zero(cfg, model, HalvingScaler(scale=2.0) if cfg.get("scaler") else None)
    _, my_meta = zero.sharded_state_dict()
    mine = {}
    for key, t in full.items():
        g = int(key.split(".")[0][1:])
        s0, s1 = my_meta["groups"][g]["shard"]
        mine[key] = t[s0:s1].clone()
    zero.load_sharded_state_dict(mine, saved["meta"])
    # the saved run used 2 ranks x MICRO_BATCH per micro-step; keep the global batch by resplitting
    data = make_data(2, steps=4, seed=5)[2:]
    per_rank = 2 * MICRO_BATCH // world
    for step in data:
        for idx, tgt in step:
            sl = slice(rank * per_rank, (rank + 1) * per_rank)
            zero.backward(nn.functional.cross_entropy(model(idx[sl]), tgt[sl]) / GAS)
        zero.step()
    return {"final": model.state_dict(), "scaler": zero.scaler.state_dict() if zero.scaler else None}


def _chain() -> nn.Module:
    """Every parameter gets a gradient, so the boundary backward's hooks can launch every bucket."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def overlap_stage1_check(rank: int, world: int) -> dict:
    """Stage 1 with overlap_comm launches its reductions during the boundary backward, same result.

    Records how many bucket reductions are in flight when each backward returns (before ``step()``),
    and the weights after training, for each variant against stage 1 without overlap.
    """
    g = torch.Generator().manual_seed(3)
    data = [[torch.randn(world * MICRO_BATCH, 6, generator=g) for _ in range(GAS)] for _ in range(STEPS)]
    out = {}
    variants = {
        "plain": {},
        "overlap": {"overlap_comm": True},
        "overlap_contig": {"overlap_comm": True, "contiguous_gradients": True},
        "overlap_offload": {"overlap_comm": True, "cpu_offload": True},
    }
    for name, kwargs in variants.items():
        model = _chain()
        options = ZeroOptions(stage=1, reduce_bucket_size=30, **kwargs)
        zero = ZeroOptimizer(torch.optim.Adam(model.parameters(), lr=0.05), options)
        inflight = []
        for step in data:
            for m, x in enumerate(step):
                zero.set_boundary(m == GAS - 1)
                zero.backward(model(x[rank * MICRO_BATCH : (rank + 1) * MICRO_BATCH]).square().mean() / GAS)
                inflight.append(len(zero._reducer._inflight))
            zero.step()
        zero.remove_hooks()
        out[name] = {
            "inflight": inflight,
            "buckets": len(zero._reducer.buckets),
            "weights": model.state_dict(),
        }
    return out


def fp32_accum_check(rank: int, world: int) -> dict:
    """bf16 model, 4 micro-steps: distance of the fp32 master to an fp32 reference, bf16 vs fp32 accumulation.

    SGD makes the master's error proportional to the accumulated gradient's error. The reference
    starts from the same bf16-rounded weights and trains in fp32 on the concatenated batch.
    """
    gas, lr = 4, 0.5
    g = torch.Generator().manual_seed(7)
    data = [torch.randn(world * MICRO_BATCH, 16, generator=g) for _ in range(gas)]
    torch.manual_seed(0)
    init = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8)).to(torch.bfloat16)
    ref = copy.deepcopy(init).float()
    for x in data:
        (ref(x).square().mean() / gas).backward()
    ref_flat = torch.cat([(p - lr * p.grad).detach().reshape(-1) for p in ref.parameters()])
    out = {}
    for stage in (1, 2):
        for accum in ("bf16", "fp32"):
            model = copy.deepcopy(init)
            options = ZeroOptions(
                stage=stage,
                reduce_bucket_size=100,
                grad_accum_dtype=torch.float32 if accum == "fp32" else None,
            )
            zero = ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=lr), options)
            for x in data:
                xb = x[rank * MICRO_BATCH : (rank + 1) * MICRO_BATCH].to(torch.bfloat16)
                zero.backward(model(xb).float().square().mean() / gas)
            grad_bytes = zero.memory_report().grad_bytes  # before the step, which frees the partition grads
            zero.step()
            tensors, meta = zero.sharded_state_dict()
            s0, s1 = meta["groups"][0]["shard"]
            err = (tensors["g0.master"] - ref_flat[s0:s1]).double().pow(2).sum()
            layout = zero.groups[0].layout
            out[f"s{stage}_{accum}"] = {
                "err_sq": float(err),
                "grad_bytes": grad_bytes,
                "numel": layout.numel,
                "partition": layout.partition_numel,
                "padded": layout.padded_numel,
            }
            zero.remove_hooks()
    return out


CONFIGS: list[dict] = [
    {"name": "s0", "stage": 0, "clip": 0.1},
    {"name": "s0_overlap", "stage": 0, "overlap_comm": True, "reduce_bucket_size": 30, "clip": 0.1},
    {"name": "s0_fp32ar_predivide", "stage": 0, "fp32_allreduce": True, "gradient_predivide_factor": 2.0},
    {"name": "s0_prescale", "stage": 0, "prescale_gradients": True, "optim": "sgd"},
    {"name": "s0_sparse", "stage": 0, "sparse_gradients": True, "gradient_predivide_factor": 3.0},
    {"name": "s0_sparse_coo", "stage": 0, "sparse_gradients": True, "sparse_emb": True, "overlap_comm": True},
    {"name": "s1", "stage": 1, "reduce_bucket_size": 30, "clip": 0.1},
    {
        "name": "s1_allreduce",
        "stage": 1,
        "reduce_scatter": False,
        "gradient_predivide_factor": 2.0,
        "optim": "adamw",
    },
    {
        "name": "s1_contig_bcast",
        "stage": 1,
        "contiguous_gradients": True,
        "allgather_partitions": False,
        "allgather_bucket_size": 10,
        "reduce_bucket_size": 25,
        "clip": 0.1,
        "scaler": True,
    },
    {"name": "s1_offload_sgd", "stage": 1, "cpu_offload": True, "optim": "sgd", "clip": 0.1},
    {"name": "s1_adagrad", "stage": 1, "optim": "adagrad", "overlap_comm": True, "no_boundary": True},
    {
        "name": "s1_overlap_contig",
        "stage": 1,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 20,
        "scaler": True,
        "clip": 0.1,
    },
    {"name": "s1_overlap_offload", "stage": 1, "overlap_comm": True, "cpu_offload": True, "optim": "adamw"},
    {"name": "s2", "stage": 2, "reduce_bucket_size": 30, "clip": 0.1},
    {"name": "s2_overlap", "stage": 2, "overlap_comm": True, "reduce_bucket_size": 30, "clip": 0.1},
    {
        "name": "s2_overlap_contig",
        "stage": 2,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 20,
        "allgather_bucket_size": 7,
        "scaler": True,
        "clip": 0.1,
    },
    {"name": "s2_allreduce_prescale", "stage": 2, "reduce_scatter": False, "prescale_gradients": True},
    {
        "name": "s2_allreduce_predivide",
        "stage": 2,
        "reduce_scatter": False,
        "gradient_predivide_factor": 4.0,
        "optim": "sgd",
    },
    {
        "name": "s2_offload_bcast",
        "stage": 2,
        "cpu_offload": True,
        "allgather_partitions": False,
        "optim": "adamw",
        "clip": 0.1,
    },
    {
        "name": "s2_bf16",
        "stage": 2,
        "dtype": torch.bfloat16,
        "reduce_bucket_size": 30,
        "contiguous_gradients": True,
        "clip": 0.1,
        "tol": 0.03,
    },
]


def portable(obj):
    """Tensors -> numpy arrays, recursively: a rank's tensors shared through torch's shared-memory
    pickling vanish when the rank exits, so results cross the process boundary by value."""
    if torch.is_tensor(obj):
        return (
            obj.detach().float().numpy().copy()
            if obj.dtype == torch.bfloat16
            else obj.detach().numpy().copy()
        )
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(portable(v) for v in obj)
    return obj


def as_tensors(obj):
    """Inverse of ``portable`` for the parts the tests compare."""
    import numpy as np

    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, dict):
        return {k: as_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(as_tensors(v) for v in obj)
    return obj
