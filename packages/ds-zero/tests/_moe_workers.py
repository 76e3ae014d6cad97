"""Module-level workers for the ZeRO-3 mixture-of-experts tests: ranks route their tokens to different
experts of a ``ModuleList`` (skewed routing), with and without leaf modules."""

from __future__ import annotations

import torch
from ds_zero import ZeroStage3Optimizer
from ds_zero.stage3 import Stage3Options
from torch import nn

WIDTH, EXPERTS = 8, 4


class Block(nn.Module):
    """A gate and a ModuleList of experts; only the experts some token is routed to run."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(WIDTH, EXPERTS, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.Tanh(), nn.Linear(2 * WIDTH, WIDTH))
            for _ in range(EXPERTS)
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(h), dim=-1)
        choice = probs.argmax(dim=-1)
        out = torch.zeros_like(h)
        for e in torch.unique(choice).tolist():  # data-dependent: which experts run differs by rank
            rows = choice == e
            out[rows] = self.experts[e](h[rows]) * probs[rows, e : e + 1]
        return h + out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.block1 = Block()
        self.block2 = Block()
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block2(self.block1(self.inp(x))))


def skewed_batch(step: int, rank: int, n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's own inputs: rank r's tokens lean towards expert r (mod EXPERTS) through the gate bias trick
    below, so ranks run different experts."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, WIDTH, generator=g)
    x[:, rank % WIDTH] += 4.0
    return x, x.sum(dim=1, keepdim=True)


def build_net() -> Net:
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():  # route input feature r to expert r (mod EXPERTS): ranks skew to different experts
        for b in (net.block1, net.block2):
            b.gate.weight.zero_()
            for i in range(WIDTH):
                b.gate.weight[i % EXPERTS, i] = 1.0
        net.inp.weight.copy_(torch.eye(WIDTH))
        net.inp.bias.zero_()
    return net


def train_zero3(rank: int, world: int, steps: int, mark: str = "auto") -> dict:
    """Stage 3 on skewed routing. ``mark``: "auto" (the expert list makes its block a leaf), "class"
    (``set_leaf_modules`` on a block whose expert list has another name), "off" (``unset_leaf_modules``)."""
    from ds_zero.stage3 import set_leaf_modules, unset_leaf_modules

    model = build_net()
    if mark == "class":
        for b in (model.block1, model.block2):
            b.branches = b._modules.pop("experts")
            b.experts = b.branches
        set_leaf_modules(model, ["Block"])
    elif mark == "off":
        unset_leaf_modules(model, [Block])
    # small buckets: several launch during backward, so a rank lacking an expert's gradient would fall behind
    options = Stage3Options(
        param_persistence_threshold=0, prefetch_bucket_size=0, max_reuse_distance=0, reduce_bucket_size=64
    )
    zero = ZeroStage3Optimizer(model, torch.optim.SGD(model.parameters(), lr=0.05), options)
    fetches = []
    fetch = zero.schedule.fetch
    zero.schedule.fetch = lambda slots: (fetches.append(len(slots)), fetch(slots))[1]
    losses, counts = [], []
    for step in range(steps):
        x, y = skewed_batch(step, rank)
        fetches.clear()
        loss = nn.functional.mse_loss(model(x), y)
        fwd = len(fetches)
        zero.backward(loss)
        counts.append((fwd, len(fetches) - fwd))
        zero.step()
        losses.append(loss.item())
    return {
        "losses": losses,
        "state": {k: v.clone() for k, v in zero.module_state_dict().items()},
        "fetches": counts,
        "leaf_params": sorted(n for n, p in model.named_parameters() if hasattr(p, "ds_z3_leaf_module")),
    }


def train_reference(world: int, steps: int) -> dict:
    """Plain torch over every rank's batch (mean of the ranks' losses), for parity."""
    model = build_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        loss = sum(
            nn.functional.mse_loss(model(x), y) for x, y in (skewed_batch(step, r) for r in range(world))
        )
        (loss / world).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.clone() for k, v in model.state_dict().items()}
