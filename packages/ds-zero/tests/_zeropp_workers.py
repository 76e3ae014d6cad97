"""Workers of the ZeRO++ tests: 4 gloo ranks as 2 "hosts" x 2 local ranks, each collective recorded.

The recorder wraps torch.distributed's collectives (they still run): for each call it notes the phase
(forward or backward), the operation, the global ranks of its group, the dtype and the bytes of the
tensors on the wire. The host groups are made here as ds-engine makes them (consecutive ranks per host).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch
import torch.distributed as dist
from ds_zero import GatheredParameters, ZeroConfigError, ZeroStage3Optimizer
from ds_zero.stage3 import HostGroups, Stage3Options
from torch import nn

VOCAB, WIDTH, MB, STEPS, LOCAL = 32, 48, 4, 8, 2

PLAIN = Stage3Options(
    param_persistence_threshold=0, reduce_bucket_size=4000, prefetch_bucket_size=0, max_reuse_distance=0
)
CASES = {
    "plain": PLAIN,
    "hpz": dataclasses.replace(PLAIN, hpz_partition_size=LOCAL),
    "qw": dataclasses.replace(PLAIN, quantized_weights=True),
    "qg": dataclasses.replace(PLAIN, quantized_gradients=True),
    "all": dataclasses.replace(
        PLAIN, hpz_partition_size=LOCAL, quantized_weights=True, quantized_gradients=True
    ),
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.l1 = nn.Linear(WIDTH, 4 * WIDTH)
        self.l2 = nn.Linear(4 * WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)
        h = h + self.l2(torch.relu(self.l1(h)))
        return self.head(h)


class Wire:
    """Records the collectives torch.distributed carries while installed (``record``)."""

    OPS = ("broadcast", "all_gather", "all_to_all_single", "reduce", "all_reduce", "isend", "send")

    def __init__(self) -> None:
        self.phase = "setup"
        self.calls: list[dict] = []

    @contextmanager
    def record(self):
        originals = {op: getattr(dist, op) for op in self.OPS}

        def wrap(op, fn):
            def call(*args, **kwargs):
                tensors = [a for a in args if torch.is_tensor(a)]
                tensors += [t for a in args if isinstance(a, list) for t in a if torch.is_tensor(t)]
                group = kwargs.get("group")
                ranks = tuple(dist.get_process_group_ranks(group)) if group is not None else tuple(
                    range(dist.get_world_size()))  # fmt: skip
                t = tensors[0] if op != "all_to_all_single" else args[1]  # the input
                self.calls.append({"phase": self.phase, "op": op, "ranks": ranks, "dtype": str(t.dtype),
                                   "bytes": t.numel() * t.element_size()})  # fmt: skip
                return fn(*args, **kwargs)

            return call

        for op, fn in originals.items():
            setattr(dist, op, wrap(op, fn))
        try:
            yield self
        finally:
            for op, fn in originals.items():
                setattr(dist, op, fn)


def host_groups(rank: int, world: int) -> HostGroups:
    """ds-engine's groups for LOCAL ranks per host (every rank creates every group, in the same order)."""
    hosts = world // LOCAL
    local = [dist.new_group(list(range(h * LOCAL, (h + 1) * LOCAL))) for h in range(hosts)]
    cross = [dist.new_group(list(range(j, world, LOCAL))) for j in range(LOCAL)]
    mine = local[rank // LOCAL]
    return HostGroups(hpz=mine, local=mine, cross=cross[rank % LOCAL])


def batch(step: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, VOCAB, (MB * world, 6), generator=g)
    noise = torch.randint(0, VOCAB, x.shape, generator=g)  # half the targets cannot be learnt: the loss
    keep = torch.rand(x.shape, generator=g) < 0.5  # stays well above 0, where 1.1x is a real bound
    return x, torch.where(keep, (x * 5 + 3) % VOCAB, noise)


def train_on_the_wire(model: nn.Module, zero, rank: int, world: int, steps: int) -> tuple[Wire, list[float]]:
    """``steps`` steps of ``zero`` on this rank's share of each ``batch``, every collective recorded with
    its phase; the losses averaged over the ranks."""
    wire, losses = Wire(), []
    with wire.record():
        for step in range(steps):
            x, y = batch(step, world)
            mine = slice(rank * MB, (rank + 1) * MB)
            wire.phase = "forward"
            out = model(x[mine]).float()
            loss = nn.functional.cross_entropy(out.reshape(-1, VOCAB), y[mine].reshape(-1))
            wire.phase = "backward"
            zero.backward(loss)
            wire.phase = "step"
            zero.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(total.item() / world)
    return wire, losses


def run(rank: int, world: int, options: Stage3Options, groups: HostGroups) -> dict:
    torch.manual_seed(0)
    model = Net()
    zero = ZeroStage3Optimizer(
        model, torch.optim.AdamW(model.parameters(), lr=1e-2), options, host_groups=groups
    )
    wire, losses = train_on_the_wire(model, zero, rank, world, STEPS)
    full = zero.module_state_dict()["l1.weight"]  # from the partitions, exact
    with GatheredParameters([model.l1.weight]):  # exact too: never the quantized gather
        exact = bool(torch.equal(model.l1.weight.detach(), full))
    return {"losses": losses, "calls": wire.calls, "secondary_numel": zero.params.secondary_numel,
            "gathered_exact": exact}  # fmt: skip


def main(rank: int, world: int) -> dict:
    groups = host_groups(rank, world)
    return {name: run(rank, world, options, groups) for name, options in CASES.items()}


def missing_groups(rank: int, world: int) -> list[str]:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    msgs = []
    for options in (Stage3Options(hpz_partition_size=2), Stage3Options(quantized_gradients=True)):
        try:
            ZeroStage3Optimizer(Net(), opt, options, host_groups=HostGroups())
        except ZeroConfigError as e:
            msgs.append(str(e))
    dist.barrier()
    return msgs
