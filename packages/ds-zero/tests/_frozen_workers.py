"""Workers of the frozen-weights tests: a LoRA-style model (frozen base, trainable low-rank adapters) on 2
gloo ranks, built from a config with ``zero_quantized_nontrainable_weights`` off and on, and as ds kept frozen
parameters before it partitioned them (``whole``: left whole on every rank, ``_whole_frozen``).

Each run measures, on its rank: the bytes of the stored partitions of the frozen parameters (their real
tensors' storages), every live CPU tensor storage after wrapping, the collectives on the wire
(``_zeropp_workers.Wire``), a frozen weight as the forward saw it, and the losses.
"""

from __future__ import annotations

from unittest import mock

import torch
from _zeropp_workers import batch, train_on_the_wire
from ds_config import load_config
from ds_zero import GatheredParameters, PartitionOnConstruction, StateDictMismatchError, ZeroStage3Optimizer
from ds_zero.stage3._construct import is_constructed_partitioned
from ds_zero.stage3._partition import PartitionedParams, _make_whole
from rank_testing.memory import live_storage_bytes
from torch import nn

VOCAB, WIDTH, RANK, MB, STEPS = 32, 64, 4, 4, 6


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (``up`` starts at zero, as LoRA's B)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.base = nn.Linear(n_in, n_out)
        self.down = nn.Linear(n_in, RANK, bias=False)
        self.up = nn.Linear(RANK, n_out, bias=False)
        nn.init.zeros_(self.up.weight)
        self.base.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.l1 = LoRALinear(WIDTH, 4 * WIDTH)
        self.l2 = LoRALinear(4 * WIDTH, WIDTH)
        self.head = LoRALinear(WIDTH, VOCAB)
        self.emb.requires_grad_(False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)
        h = h + self.l2(torch.relu(self.l1(h)))
        return self.head(h)


def config(quantized: bool) -> dict:
    return {
        "train_micro_batch_size_per_gpu": MB,
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "stage3_prefetch_bucket_size": 0,
            "stage3_max_reuse_distance": 0,
            "zero_quantized_nontrainable_weights": quantized,
        },
    }


def _stored_bytes(model: nn.Module) -> tuple[int, int, set[str]]:
    """Bytes of the storages holding the frozen parameters at rest, their elements, their dtypes."""
    nbytes, numel, dtypes = 0, 0, set()
    for p in model.parameters():
        if p.requires_grad:
            continue
        held = p.ds_tensor if p.data.numel() == 0 else p.data  # partitioned, or whole
        nbytes += held.untyped_storage().nbytes()
        numel += held.numel()
        dtypes.add(str(held.dtype))
    return nbytes, numel, dtypes


def _whole_frozen(self, p, names, device, quantized) -> None:
    """ds's frozen parameters before they were partitioned: left whole (gathered whole if cut at
    construction), unmanaged; the baseline of the exact losses."""
    if is_constructed_partitioned(p):
        _make_whole(p)


def whole(rank: int, world: int, dtype: torch.dtype, steps: int) -> dict:
    with mock.patch.object(PartitionedParams, "_partition_frozen", _whole_frozen):
        return run(rank, world, False, dtype, steps)


def run(rank: int, world: int, quantized: bool, dtype: torch.dtype, steps: int) -> dict:
    torch.manual_seed(0)
    model = Net().to(dtype)
    original = model.l1.base.weight.detach().clone()
    whole_bytes = _stored_bytes(model)[0]  # before wrapping: every frozen parameter whole, in its dtype
    before = live_storage_bytes()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    zero = ZeroStage3Optimizer.from_config(model, opt, load_config(config(quantized), world_size=world))
    del opt
    live = live_storage_bytes() - before - original.untyped_storage().nbytes()
    stored, owned, dtypes = _stored_bytes(model)
    seen: list[torch.Tensor] = []
    whole_in_backward: list[list[str]] = []  # frozen parameters whole when backward reaches l1's output

    def whole_frozen(grad: torch.Tensor) -> None:
        whole_in_backward.append(
            [n for n, p in model.named_parameters() if not p.requires_grad and p.data.numel()]
        )

    hooks = [
        model.l1.base.register_forward_pre_hook(lambda m, i: seen.append(m.weight.detach().clone())),
        model.l1.register_forward_hook(lambda m, i, o: o.register_hook(whole_frozen) and None),
    ]
    wire, losses = train_on_the_wire(model, zero, rank, world, steps)
    for h in hooks:
        h.remove()
    state = zero.module_state_dict()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    try:  # a checkpoint saved without the frozen weights (exclude_frozen_parameters), loaded strictly
        zero.load_module_state_dict({k: v for k, v in state.items() if k not in frozen})
        missing = []
    except StateDictMismatchError as e:
        missing = sorted(e.missing)
    weight = model.l1.base.weight
    with GatheredParameters([weight], modifier_rank=0):  # rank 0's change reaches every rank's piece
        gathered = weight.detach().float().clone()
        if rank == 0:
            with torch.no_grad():
                weight.mul_(2)
    modified = zero.module_state_dict()["l1.base.weight"].float()
    return {
        "losses": losses,
        "calls": wire.calls,
        "whole_bytes": whole_bytes,
        "stored_bytes": stored,
        "stored_numel": owned,
        "stored_dtypes": dtypes,
        "frozen_numel": sum(
            getattr(p, "ds_numel", p.numel()) for p in model.parameters() if not p.requires_grad
        ),
        "live_bytes": live,
        "element_size": torch.empty(0, dtype=dtype).element_size(),
        "forward_weight_error": (seen[0].float() - original.float()).abs().max().item(),
        "forward_weight_scale": original.float().abs().max().item(),
        "forward_weight": seen[0].float(),
        "forward_weight_changed": not torch.equal(seen[0], seen[-1]),
        "state_weight": state["l1.base.weight"].float(),
        "trainable_part_dtypes": [str(d) for d in zero.params.part_dtypes],
        "whole_in_backward": whole_in_backward[0],
        "strict_load_missing": missing,
        "gathered_weight": gathered,
        "modified_weight": modified,
        "frozen_released": all(p.data.numel() == 0 for p in model.parameters() if not p.requires_grad),
    }


def built_in_init(rank: int, world: int) -> dict[bool, tuple[bool, bool]]:
    """Per value of the key: does a model built inside ``zero.Init`` (frozen weights cut as they are built)
    compute what a plain model holding its gathered state computes, and are its frozen weights still
    partitioned once the optimizer is built (empty data, a piece of at most half their elements)?"""
    x, _ = batch(0, world)
    out = {}
    for quantized in (False, True):
        torch.manual_seed(0)
        with PartitionOnConstruction():
            model = Net()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        zero = ZeroStage3Optimizer.from_config(model, opt, load_config(config(quantized), world_size=world))
        cut = all(
            p.data.numel() == 0 and p.ds_tensor.numel() <= p.ds_numel // 2 + 4
            for p in model.parameters()
            if not p.requires_grad
        )
        reference = Net()
        try:  # a frozen weight left cut is empty: its state does not load, the forward fails
            reference.load_state_dict(zero.module_state_dict())
            with torch.no_grad():
                out[quantized] = (torch.equal(model(x[:MB]), reference(x[:MB])), cut)
        except RuntimeError:
            out[quantized] = (False, cut)
    return out


def main(rank: int, world: int) -> dict:
    return {
        "whole": whole(rank, world, torch.float32, STEPS),
        "off": run(rank, world, False, torch.float32, STEPS),
        "bf16_off": run(rank, world, False, torch.bfloat16, 1),
        "on": run(rank, world, True, torch.float32, STEPS),
        "bf16_on": run(rank, world, True, torch.bfloat16, 1),
        "built_in_init": built_in_init(rank, world),
    }
