"""Workers that observe what each option does (collective calls, bytes, dtypes, timing), run by spawn.

Collectives are observed with a TorchDispatchMode: ``torch.distributed`` calls reach the dispatcher as
``c10d.*`` ops, so the mode sees every real call, its tensors and their values, and runs it unchanged.
"""

from __future__ import annotations

import itertools
import os

import torch
from ds_zero import GradientReducer, ZeroConfigError, ZeroOptimizer, ZeroOptions, _comm
from ds_zero._transport import ENV
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


class Collectives(TorchDispatchMode):
    """Count ``c10d`` ops, the bytes of their tensors, their dtypes, and the sum of |input| before each."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}
        self.bytes = 0
        self.dtypes: set[torch.dtype] = set()
        self.abs_in = 0.0
        self.sent_storages: set[int] = set()  # storages that point-to-point sends read from
        self.all_reduced: list[tuple[int, int]] = []  # (storage, numel) of each all_reduce's tensor
        # the storages behind those addresses, held so that no later tensor can reuse an address
        self._held: list[torch.UntypedStorage] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name.startswith("c10d."):
            self.calls[name] = self.calls.get(name, 0) + 1
            first = args[0]
            if name == "c10d.send":
                self.sent_storages |= {t.untyped_storage().data_ptr() for t in first}
                self._held += [t.untyped_storage() for t in first]
            if name == "c10d.allreduce_":
                self.all_reduced += [(t.untyped_storage().data_ptr(), t.numel()) for t in first]
                self._held += [t.untyped_storage() for t in first]
            tensors = first if isinstance(first, list | tuple) else [first]
            for t in tensors:
                if isinstance(t, list | tuple):  # all_gather's output is a list of lists
                    continue
                self.bytes += t.numel() * t.element_size()
                self.dtypes.add(t.dtype)
                if name in ("c10d.allreduce_", "c10d.reduce_"):
                    self.abs_in += float(t.detach().abs().sum())
        return func(*args, **(kwargs or {}))


def _chain() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def _batch(rank: int) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(10 + rank))


def gather_calls(rank: int, world: int) -> dict:
    """Collective calls made by step()'s weight gather, with and without allgather_partitions, where the
    backend's all-gather is the native one (``native``) and as shipped for gloo (broadcasts)."""
    out: dict = {"native": {}, "shipped": {}}
    saved = _comm.GATHER_CHOICE
    for table in ("native", "shipped"):
        _comm.GATHER_CHOICE = {"gloo": lambda world, nbytes: "all_gather"} if table == "native" else saved
        try:
            for flag in (True, False):
                model = _chain()
                zero = ZeroOptimizer(
                    torch.optim.SGD(model.parameters(), lr=0.1),
                    ZeroOptions(stage=1, allgather_partitions=flag),
                )
                zero.backward(model(_batch(rank)).square().mean())
                zero._reducer.flush()  # reduce first, so the mode below sees the step's collectives only
                with Collectives() as seen:
                    zero.step()
                out[table][flag] = seen.calls
        finally:
            _comm.GATHER_CHOICE = saved
    return out


def overlap_in_backward(rank: int, world: int) -> dict:
    """Stage 2: reductions still in flight while backward runs (first layer's grad, produced last)."""
    out = {}
    for flag in (True, False):
        model = _chain()
        zero = ZeroOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            ZeroOptions(stage=2, overlap_comm=flag, reduce_bucket_size=40),
        )
        seen: list[tuple[int, int]] = []

        def record(_p, zero=zero, seen=seen) -> None:
            r = zero._reducer
            seen.append((r.schedule.next, len(r._inflight)))

        model[0].weight.register_post_accumulate_grad_hook(record)  # runs after ZeRO's hook
        zero.backward(model(_batch(rank)).square().mean())
        zero.step()
        out[flag] = {
            "launched_inflight": seen[0],
            "buckets": len(zero._reducer.buckets),
            "w": model.state_dict(),
        }
    return out


def scaling_inputs(rank: int, world: int) -> dict:
    """Sum of |gradient| handed to the reductions: plain, prescale_gradients, gradient_predivide_factor 4."""
    out = {}
    variants = {
        "plain": {},
        "prescale": {"prescale_gradients": True},
        "predivide": {"gradient_predivide_factor": 4.0},
    }
    for name, kwargs in variants.items():
        model = _chain()
        zero = ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), ZeroOptions(stage=1, **kwargs))
        zero.backward(model(_batch(rank)).square().mean())
        with Collectives() as seen:
            zero._reducer.flush()
        out[name] = seen.abs_in
        zero.step()
    return out


def fp32_allreduce_dtypes(rank: int, world: int) -> dict:
    """Stage 0, bf16 model: the dtype the all-reduce carries, with and without fp32_allreduce."""
    out = {}
    for flag in (True, False):
        model = _chain().to(torch.bfloat16)
        reducer = GradientReducer(model, fp32_allreduce=flag)
        model(_batch(rank).to(torch.bfloat16)).float().square().mean().backward()
        with Collectives() as seen:
            reducer.reduce()
        out[flag] = sorted(str(d) for d in seen.dtypes)
    return out


def stage0_in_place(rank: int, world: int) -> dict:
    """Stage 0: which tensors the all-reduces carry for a model with one large and several small
    gradients, and whether the large one stayed the same tensor, with its average in it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 2))
    reducer = GradientReducer(model)
    model(_batch(rank).repeat(1, 2)[:, :8]).square().mean().backward()
    big = model[2].weight
    before = big.grad
    local = {n: p.grad.clone() for n, p in model.named_parameters()}
    with Collectives() as seen:
        reducer.reduce()
    return {
        "big_numel": big.numel(),
        "big_storage": before.untyped_storage().data_ptr(),
        "same_tensor": big.grad is before,
        "all_reduced": seen.all_reduced,
        "local": local,
        "averaged": {n: p.grad.clone() for n, p in model.named_parameters()},
        "numel": sum(p.numel() for p in model.parameters()),
    }


def sparse_bytes(rank: int, world: int) -> dict:
    """Stage 0: bytes the collectives carry for a 1000-row embedding of which 3 rows are used."""
    out = {}
    for flag in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(1000, 16), nn.Flatten(), nn.Linear(48, 2))
        reducer = GradientReducer(model, sparse_gradients=flag)
        model(torch.tensor([[rank, 5, 7]])).square().mean().backward()
        with Collectives() as seen:
            reducer.reduce()
        out[flag] = {"bytes": seen.bytes, "grad": model[0].weight.grad.clone()}
    return out


def unused_parameters(rank: int, world: int) -> dict:
    """ignore_unused_parameters false with offload: the step names every parameter without a gradient."""
    out = {}
    for stage, flag, offload in itertools.product((1, 2), (True, False), (True, False)):
        model = _chain()
        model.add_module("unused", nn.Linear(3, 3))
        names = {id(p): n for n, p in model.named_parameters()}
        zero = ZeroOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            ZeroOptions(stage=stage, ignore_unused_parameters=flag, cpu_offload=offload),
            param_names=names,
        )
        x = _batch(rank)
        zero.backward(model[:5](x).square().mean())  # the "unused" layer takes no part
        try:
            zero.step()
            out[(stage, flag, offload)] = None
        except ZeroConfigError as exc:
            out[(stage, flag, offload)] = (str(exc), isinstance(exc, AssertionError))
    return out


def main(rank: int, world: int) -> dict:
    # each option's effect is observed on the c10d ops gloo runs: no host transport (test_zero_shm.py
    # checks that the shared-memory one carries what these options hand it)
    os.environ[ENV] = "torch"
    return {
        "gather": gather_calls(rank, world),
        "overlap": overlap_in_backward(rank, world),
        "scaling": scaling_inputs(rank, world),
        "fp32_allreduce": fp32_allreduce_dtypes(rank, world),
        "sparse": sparse_bytes(rank, world),
        "in_place": stage0_in_place(rank, world),
        "unused": unused_parameters(rank, world),
    }
