"""Module-level worker functions for the stage-3 tests (run by rank_testing.spawn: real processes, gloo)."""

from __future__ import annotations

import copy
import dataclasses
import weakref

import torch
import torch.utils.checkpoint as ckpt
from ds_zero import GatheredParameters, PartitionOnConstruction, ZeroStage3Optimizer
from ds_zero.stage3 import Stage3Options, register_external_parameter
from torch import nn

VOCAB, WIDTH, MB = 13, 8, 2  # MB: samples per rank per micro-step


class Net(nn.Module):
    """Tied embedding/head, a parameter that never gets a gradient, optional activation checkpointing."""

    def __init__(self, checkpointing: str | None = None) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.l1 = nn.Linear(WIDTH, 16)
        self.l2 = nn.Linear(16, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # a parameter used by two modules
        self.unused = nn.Linear(3, 3)
        self.checkpointing = checkpointing

    def _block(self, h: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.tanh(self.l1(h)))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)  # (B, T, WIDTH)
        if self.checkpointing is None:
            h = self._block(h)
        else:
            h = ckpt.checkpoint(self._block, h, use_reentrant=self.checkpointing == "reentrant")
        return self.head(self.norm(h))  # (B, T, VOCAB)


def batch(step: int, world: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + micro)
    x = torch.randint(0, VOCAB, (MB * world, 5), generator=g)
    return x, (x * 3 + 1) % VOCAB


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))


def train_reference(steps: int, world: int, gas: int, clip: float, checkpointing: str | None = None) -> dict:
    """Plain torch on one process over the global batch (every rank computes it the same way)."""
    torch.manual_seed(0)
    net = Net(checkpointing)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for step in range(steps):
        for micro in range(gas):
            x, y = batch(step, world, micro)
            (loss_of(net, x, y) / gas).backward()
        for p in net.parameters():  # ZeRO gives every trainable parameter a (zero) gradient
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if clip > 0:
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in net.parameters())).item()
            for p in net.parameters():
                p.grad.mul_(min(1.0, clip / (norm + 1e-6)))
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def build(options: Stage3Options, checkpointing: str | None = None, clip: float = 0.0, dtype=torch.float32):
    torch.manual_seed(0)
    model = Net(checkpointing).to(dtype)
    options = dataclasses.replace(options, clip_grad=clip)
    zero = ZeroStage3Optimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), options)
    return model, zero


def train(
    model: nn.Module, zero: ZeroStage3Optimizer, rank: int, world: int, steps: int, gas: int, first: int = 0
) -> None:
    for step in range(first, first + steps):
        for micro in range(gas):
            x, y = batch(step, world, micro)
            mine = slice(rank * MB, (rank + 1) * MB)
            zero.backward(loss_of(model, x[mine], y[mine]) / gas)
        zero.step()


def max_error(full: dict, ref: dict) -> float:
    return max((full[k].float() - v.float()).abs().max().item() for k, v in ref.items())


def parity(rank: int, world: int) -> dict:
    """Training matches plain torch: fp32, accumulation, clipping, activation checkpointing (both kinds),
    overlap_comm (with gradients arriving late for a bucket already sent, from the recomputation)."""
    out = {}
    for name, gas, clip, checkpointing, overlap in (
        ("plain", 1, 0.0, None, False),
        ("gas2-clip", 2, 0.05, None, False),
        ("checkpoint-reentrant", 1, 0.0, "reentrant", False),
        ("checkpoint", 2, 0.0, "non-reentrant", False),
        ("overlap-checkpoint-clip", 2, 0.05, "non-reentrant", True),
    ):
        ref = train_reference(4, world, gas, clip, checkpointing)
        options = Stage3Options(param_persistence_threshold=0, reduce_bucket_size=40, overlap_comm=overlap)
        model, zero = build(options, checkpointing, clip)
        train(model, zero, rank, world, 4, gas)
        out[name] = max_error(zero.module_state_dict(), ref)
    return out


def partitioning(
    rank: int,
    world: int,
    threshold: int = 0,
    bucket: int = 40,
    overlap: bool = False,
    keep_bytes: int | None = None,
    **more: int,
) -> dict:
    """What a rank holds after a step, and how many collectives gathering and reduction took.

    Prefetch and reuse are off: each module's parameters are gathered when it runs, released after.
    """
    options = Stage3Options(
        param_persistence_threshold=threshold,
        reduce_bucket_size=bucket,
        prefetch_bucket_size=0,
        max_reuse_distance=0,
        overlap_comm=overlap,
        **more,
    )
    from ds_zero.stage3 import _grads

    model, zero = build(options)
    total = sum(s.numel for s in zero.params.slots.values())
    kept, _grads.KEEP_BYTES = _grads.KEEP_BYTES, _grads.KEEP_BYTES if keep_bytes is None else keep_bytes
    train(model, zero, rank, world, 1, 1)
    gathers, reduces = zero.params.gathered_numel, zero.grads.reduce_calls
    allocations = zero.grads.buffers_allocated
    train(model, zero, rank, world, 1, 1)
    allocations = zero.grads.buffers_allocated - allocations
    _grads.KEEP_BYTES = kept
    state = zero.sub_groups.state_of(zero.optimizer, 0)
    gathered_per_step, reduces_per_step = (
        zero.params.gathered_numel - gathers,
        zero.grads.reduce_calls - reduces,
    )
    # the partition gradient exists from a backward to the step only: the step frees its storage
    x, y = batch(2, world)
    zero.backward(loss_of(model, x[rank * MB : (rank + 1) * MB], y[rank * MB : (rank + 1) * MB]))
    grad_refs = [weakref.ref(g) for g in zero.grad_parts]
    held = [r() is not None for r in grad_refs]
    zero.step()
    return {
        "grad_held_after_backward": held,
        "grad_freed_after_step": [r() is None for r in grad_refs],
        "total_numel": total,
        "whole_after_step": {n: p.numel() for n, p in model.named_parameters() if p.numel() > 0},
        "partition_numel": sum(p.numel() for p in zero.params.parts),
        "master_is_partition": zero.masters[0].data_ptr() == zero.params.parts[0].data_ptr(),
        "state_numel": {k: v.numel() for k, v in state.items() if torch.is_tensor(v) and v.dim() == 1},
        "gathered_numel_per_step": gathered_per_step,
        "reduces_per_step": reduces_per_step,
        "bucket_buffers_allocated_per_step": allocations,
        "buckets": len(zero.grads._buckets),
        "peak_inflight": zero.grads.peak_inflight,
        "peak_live_numel": zero.params.peak_live_numel,
        "largest_module_numel": max(
            sum(s.numel for s in zero.params.slots_of(m._parameters.values())) for m in model.modules()
        ),
    }


def mixed_precision(rank: int, world: int) -> dict:
    """bf16 keeps fp32 masters apart from the bf16 partition and still trains like fp32 (loosely)."""
    ref = train_reference(3, world, 2, 0.0)
    model, zero = build(
        Stage3Options(param_persistence_threshold=0, reduce_bucket_size=40), dtype=torch.bfloat16
    )
    train(model, zero, rank, world, 3, 2)
    return {
        "error": max_error(zero.fp32_state_dict(), {k: v for k, v in ref.items() if "emb" in k or "l1" in k}),
        "master_dtype": str(zero.masters[0].dtype),
        "partition_dtype": str(zero.params.parts[0].dtype),
        "gathered_dtype": str(zero.module_state_dict()["l1.weight"].dtype),
        "tied_names_share_one_tensor": (lambda sd: sd["head.weight"] is sd["emb.weight"])(
            zero.module_state_dict()
        ),
    }


def gathered_modify(rank: int, world: int) -> dict:
    """GatheredParameters: rank 0's change reaches every rank's partition and the fp32 masters."""
    model, zero = build(Stage3Options(param_persistence_threshold=0), dtype=torch.bfloat16)
    with GatheredParameters([model.l1.weight, model.l1.bias], modifier_rank=0):
        whole = model.l1.weight.numel()
        if rank == 0:
            with torch.no_grad():
                model.l1.weight.fill_(0.5)
    released = model.l1.weight.numel()
    with GatheredParameters(model.l1.bias):  # no modifier: changes are discarded
        with torch.no_grad():
            model.l1.bias.fill_(7.0)
    full = zero.fp32_state_dict()
    return {
        "whole_inside": whole,
        "released_after": released,
        "weight_values": sorted(set(full["l1.weight"].reshape(-1).tolist())),
        "bias_has_7": bool((full["l1.bias"] == 7.0).any()),
    }


def construct_partitioned(rank: int, world: int) -> dict:
    """A model built inside PartitionOnConstruction never holds whole weights and trains like one that did."""
    torch.manual_seed(0)
    normal = Net()
    torch.manual_seed(0)
    with PartitionOnConstruction():
        cut = Net()
    held = {n: p.numel() for n, p in cut.named_parameters()}
    chunk_numel = sum(p.ds_chunk.numel() for p in cut.parameters())
    ref = copy.deepcopy(normal)
    zero_ref = ZeroStage3Optimizer(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), Stage3Options())
    zero = ZeroStage3Optimizer(cut, torch.optim.AdamW(cut.parameters(), lr=1e-2), Stage3Options())
    train(ref, zero_ref, rank, world, 2, 1)
    train(cut, zero, rank, world, 2, 1)
    return {
        "held": held,
        "chunk_numel": chunk_numel,
        "total_numel": sum(p.numel() for p in normal.parameters()),
        "error": max_error(zero.module_state_dict(), zero_ref.module_state_dict()),
        "init_restored": nn.Linear.__init__.__name__ == "__init__"
        and not hasattr(nn.Linear.__init__, "__wrapped__"),
    }


def fp16_overflow(rank: int, world: int) -> dict:
    """fp16 with a loss scaler: an inf gradient on one rank skips the step on every rank."""
    from _workers import HalvingScaler

    torch.manual_seed(0)
    model = Net().half()
    scaler = HalvingScaler(1024.0)
    zero = ZeroStage3Optimizer(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        Stage3Options(param_persistence_threshold=0),
        scaler=scaler,
    )
    before = zero.fp32_state_dict()
    x, y = batch(0, world)
    mine = slice(rank * MB, (rank + 1) * MB)
    loss = loss_of(model, x[mine], y[mine])
    zero.backward(loss * (float("inf") if rank == world - 1 else 1.0))
    skipped = not zero.step()
    after = zero.fp32_state_dict()
    zero.backward(loss_of(model, x[mine], y[mine]))
    applied = zero.step()
    return {
        "skipped": skipped,
        "unchanged": max_error(after, before) == 0.0,
        "applied_next": applied,
        "scale": scaler.loss_scale,
        "updates": scaler.updates,
    }


class ExternalUse(nn.Module):
    """The root multiplies by the embedding's weight itself: a parameter used outside its module."""

    def __init__(self, register: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        if register:
            register_external_parameter(self, self.emb.weight)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.emb(idx) @ self.emb.weight.t()  # (B, T, VOCAB)


def external_parameter(rank: int, world: int) -> dict:
    """Without registration the released weight fails loudly; registered, it trains like plain torch."""
    out = {}
    for register in (False, True):
        torch.manual_seed(0)
        model = ExternalUse(register)
        ref = copy.deepcopy(model)
        zero = ZeroStage3Optimizer(
            model, torch.optim.SGD(model.parameters(), lr=0.1), Stage3Options(param_persistence_threshold=0)
        )
        x, y = batch(0, world)
        mine = slice(rank * MB, (rank + 1) * MB)
        try:
            zero.backward(loss_of(model, x[mine], y[mine]))
        except RuntimeError as e:
            out[f"register={register}"] = f"error: {str(e)[:60]}"
            zero.hooks.end_backward()
            continue
        zero.step()
        loss_of(ref, x, y).backward()
        torch.optim.SGD(ref.parameters(), lr=0.1).step()
        out[f"register={register}"] = max_error(zero.module_state_dict(), ref.state_dict())
    return out


def fetch_schedule(rank: int, world: int) -> dict:
    """Per setting of the four schedule keys: what was whole before each module ran, live peak, traffic.

    The probe hooks are registered before the stage-3 hooks, so they see each module just before its fetch.
    Step 1 records the module order; the figures are from step 2, which follows it.
    """
    ref = train_reference(2, world, 1, 0.0)
    out = {}
    for name, kw in (
        ("off", {"prefetch_bucket_size": 0, "max_reuse_distance": 0}),
        ("prefetch", {"prefetch_bucket_size": 10_000, "max_reuse_distance": 0}),
        ("reuse", {"prefetch_bucket_size": 0, "max_reuse_distance": 10_000}),
        (
            "reuse-live150",
            {"prefetch_bucket_size": 0, "max_reuse_distance": 10_000, "max_live_parameters": 150},
        ),
        (
            "all-live150",
            {"prefetch_bucket_size": 10_000, "max_reuse_distance": 10_000, "max_live_parameters": 150},
        ),
        ("off-sub50", {"prefetch_bucket_size": 0, "max_reuse_distance": 0, "sub_group_size": 50}),
        ("all-eval", {"prefetch_bucket_size": 10_000, "max_reuse_distance": 10_000}),
    ):
        whole_after_eval = None
        torch.manual_seed(0)
        model = Net()
        ready: list[int] = []  # per module forward: elements already whole (or in flight) before its fetch
        for m in (model.emb, model.l1, model.l2, model.norm, model.head):
            m.register_forward_pre_hook(
                lambda mod, _, ready=ready: ready.append(
                    sum(p.numel() for p in mod._parameters.values() if p is not None)
                )
            )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        calls: list[int] = []  # per inner optimizer call: elements with a gradient (the sub-group stepped)
        opt.register_step_pre_hook(
            lambda o, *_, calls=calls: calls.append(
                sum(p.numel() for g in o.param_groups for p in g["params"] if p.grad is not None)
            )
        )
        zero = ZeroStage3Optimizer(model, opt, Stage3Options(param_persistence_threshold=0, **kw))
        train(model, zero, rank, world, 1, 1)
        ready.clear(), calls.clear()
        gathered = zero.params.gathered_numel
        zero.params.peak_live_numel = 0
        if name == "all-eval":  # a forward outside the trace (no backward) before the next step
            with torch.no_grad():
                model(batch(7, world)[0][rank * MB : (rank + 1) * MB])
            whole_after_eval = sum(s.numel for s in zero.params.slots.values() if s.gathered)
        train(model, zero, rank, world, 1, 1, first=1)
        out[name] = {
            "ready_before_forward": sum(ready),
            "prefetch_calls": zero.schedule.prefetch_calls,
            "gathered_numel": zero.params.gathered_numel - gathered,
            "peak_live_numel": zero.params.peak_live_numel,
            "optimizer_calls": list(calls),
            "partition_numel": zero.params.parts[0].numel(),
            "error": max_error(zero.module_state_dict(), ref),
            "whole_after_eval": whole_after_eval,
            "whole_after_step": sum(s.numel for s in zero.params.slots.values() if s.gathered),
            "state": {k: v.tolist() for k, v in zero.sharded_state_dict()[0].items()},
        }
    return out


FORWARD_MODULES = ("emb", "l1", "l2", "norm", "head")  # the modules with parameters that Net's forward runs


def coalescing(rank: int, world: int) -> dict:
    """Collectives one forward issues to gather parameters (the step after the one that recorded the trace),
    counted where they run: the shared-memory transport's calls, and torch.distributed's ``c10d`` calls and
    bytes on a group the transport does not carry; with prefetch and reuse off, and with prefetch on."""
    import os

    import torch.distributed as dist
    from _effects import Collectives
    from ds_zero._transport import ENV

    out: dict = {}
    x, y = batch(1, world)
    mine = slice(rank * MB, (rank + 1) * MB)
    for name, kw in (("off", {"prefetch_bucket_size": 0, "max_reuse_distance": 0}), ("prefetch", {})):
        model, zero = build(Stage3Options(param_persistence_threshold=0, **kw))
        train(model, zero, rank, world, 1, 1)
        host = zero.host_transport
        calls, gathers = (host.calls if host else 0), zero.params.gather_calls
        loss = loss_of(model, x[mine], y[mine])
        out[name] = {
            "transport": (host.calls if host else 0) - calls,
            "gather_calls": zero.params.gather_calls - gathers,
        }
        zero.backward(loss)
    before = os.environ.get(ENV)
    os.environ[ENV] = "torch"
    try:
        group = dist.new_group(list(range(world)), backend="gloo")
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        options = Stage3Options(param_persistence_threshold=0, prefetch_bucket_size=0, max_reuse_distance=0)
        zero = ZeroStage3Optimizer(model, opt, options, process_group=group)
    finally:
        os.environ.pop(ENV) if before is None else os.environ.__setitem__(ENV, before)
    train(model, zero, rank, world, 1, 1)
    with Collectives() as seen:
        loss = loss_of(model, x[mine], y[mine])
    zero.backward(loss)
    layout = zero.params.layouts[0]
    runs = [zero.params.slots_of(getattr(model, m)._parameters.values()) for m in FORWARD_MODULES]
    out["torch"] = {
        "calls": seen.calls,
        "bytes": seen.bytes,
        "module_numel": sum(s.numel for slots in runs for s in slots),
        "owners_per_module": sum(len(layout.owners(slots[0].start, slots[-1].end)) for slots in runs),
        "owners_per_parameter": sum(len(layout.owners(s.start, s.end)) for slots in runs for s in slots),
    }
    zero.remove_hooks()
    dist.destroy_process_group(group)
    return out


def saved_weights(rank: int, world: int) -> dict:
    """After a forward, what autograd saved of the weights: ``nn.Linear`` saves ``weight.t()``, a view of
    the gathered tensor; its storage must be freed with the release, not kept whole until backward."""
    options = Stage3Options(param_persistence_threshold=0, prefetch_bucket_size=0, max_reuse_distance=0)
    model, zero = build(options)
    x, y = batch(0, world)
    loss = loss_of(model, x[rank * MB : (rank + 1) * MB], y[rank * MB : (rank + 1) * MB])
    params = {id(s.param): s for s in zero.params.slots.values()}
    views, held, seen, stack = 0, 0, set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack += [n for n, _ in node.next_functions]
        for attr in dir(node):
            t = getattr(node, attr) if attr.startswith("_saved_") else None
            slot = params.get(id(t._base)) if torch.is_tensor(t) and t._base is not None else None
            if slot is not None and not slot.gathered:
                views += 1
                held += t.untyped_storage().nbytes()
    zero.backward(loss)  # the saved views are refilled by backward's gather: training works on
    zero.step()
    return {"saved_weight_views": views, "held_bytes": held}


def world_main(rank: int, world: int) -> dict:
    return {
        "saved": saved_weights(rank, world),
        "schedule": fetch_schedule(rank, world),
        "parity": parity(rank, world),
        "partition": partitioning(rank, world),
        "persist": partitioning(rank, world, threshold=50),
        "persist_capped": partitioning(rank, world, threshold=50, model_persistence_threshold=40),
        "coalescing": coalescing(rank, world),
        "big_bucket": partitioning(rank, world, bucket=10_000),
        "overlap": partitioning(rank, world, overlap=True),
        "no_keep": partitioning(rank, world, keep_bytes=0),
        "bf16": mixed_precision(rank, world),
        "gathered": gathered_modify(rank, world),
        "construct": construct_partitioned(rank, world),
        "fp16": fp16_overflow(rank, world),
        "external": external_parameter(rank, world),
    }
