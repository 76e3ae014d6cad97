"""Rank functions for test_pipeline.py: a tiny tied-embedding model as a PipelineModule, and the same model
without a pipeline (same seeds, same micro-batches) as the reference."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

VOCAB, DIM, SEQ, MICRO = 16, 8, 4, 2


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(VOCAB, DIM) * 0.5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids]


def head(embed: Embed, x: torch.Tensor) -> torch.Tensor:
    return x @ embed.weight.t()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def specs(n_blocks: int = 4) -> list[Any]:
    from ds_pipe import LayerSpec, TiedLayerSpec

    return [
        TiedLayerSpec("embed", Embed),
        *[LayerSpec(Block) for _ in range(n_blocks)],
        TiedLayerSpec("embed", Embed, forward_fn=head),
    ]


def batches(rank_dp: int, dp: int, n: int, seed: int = 7) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every micro-batch of the run (all data-parallel ranks'), and this rank's share in order."""
    g = torch.Generator().manual_seed(seed)
    everything = [
        (
            torch.randint(0, VOCAB, (MICRO, SEQ), generator=g),
            torch.randint(0, VOCAB, (MICRO, SEQ), generator=g),
        )
        for _ in range(n * dp)
    ]
    return everything


def reference_losses(config: dict, steps: int, dp: int, n_blocks: int = 4) -> list[float]:
    """The same model as one module: each step averages the loss of gas x dp micro-batches."""
    base = 1234
    torch.manual_seed(base)
    layers: list[Any] = []
    embed = None
    for idx in range(n_blocks + 2):
        torch.manual_seed(base + idx)
        if idx == 0:
            embed = Embed()
            layers.append(embed)
        elif idx == n_blocks + 1:
            layers.append(lambda x, e=embed: head(e, x))
        else:
            layers.append(Block())
    params = [p for m in layers if isinstance(m, nn.Module) for p in m.parameters()]
    opt = torch.optim.Adam(params, lr=config["optimizer"]["params"]["lr"])
    gas = config["gradient_accumulation_steps"]
    data = batches(0, dp, steps * gas)
    out = []
    for step in range(steps):
        opt.zero_grad()
        total = 0.0
        # data-parallel rank d reads micro-batches d*steps*gas + step*gas ... of its own share
        micro = [data[d * steps * gas + step * gas + i] for d in range(dp) for i in range(gas)]
        for x, y in micro:
            h = x
            for layer in layers:
                h = layer(h)
            loss = loss_fn(h, y) / len(micro)
            loss.backward()
            total += loss.item()
        if config.get("gradient_clipping"):
            torch.nn.utils.clip_grad_norm_(params, config["gradient_clipping"])
        opt.step()
        out.append(total)
    return out


def train(
    rank: int, world: int, stages: int, config: dict, steps: int, partition: str = "parameters"
) -> dict:
    import ds_engine
    from ds_engine.topology import reset_topology
    from ds_pipe import PipelineModule

    reset_topology()
    model = PipelineModule(
        specs(),
        num_stages=stages,
        loss_fn=loss_fn,
        partition_method=partition,
        seed_layers=True,
        seed_fn=torch.manual_seed,
    )
    engine, *_ = ds_engine.initialize(
        model=model, config=copy.deepcopy(config), model_parameters=model.parameters()
    )
    dp = engine.grid.data_parallel_size
    gas = config["gradient_accumulation_steps"]
    data = batches(0, dp, steps * gas)
    d = engine.grid.get_data_parallel_rank()
    mine = iter(data[d * steps * gas : (d + 1) * steps * gas])
    losses = [float(engine.train_batch(mine)) for _ in range(steps)]
    return {
        "losses": losses,
        "stage": engine.stage_id,
        "parts": model.parts,
        "first": engine.is_first_stage(),
        "last": engine.is_last_stage(),
    }


class CountingBlock(Block):
    """A block that counts its forward calls (activation checkpointing runs forward again in backward)."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CountingBlock.calls += 1
        return super().forward(x)


def checkpoint_interval_calls(rank: int, world: int, config: dict) -> int:
    """Forward calls of the blocks in one train_batch of 2 micro-batches, with the given config."""
    import ds_engine
    from ds_engine.topology import reset_topology
    from ds_pipe import LayerSpec, PipelineModule

    reset_topology()
    model = PipelineModule(
        [LayerSpec(CountingBlock), LayerSpec(CountingBlock)],
        num_stages=1,
        loss_fn=lambda o, y: o.pow(2).mean(),
    )
    engine, *_ = ds_engine.initialize(model=model, config=copy.deepcopy(config))
    CountingBlock.calls = 0
    engine.train_batch(iter([(torch.randn(2, DIM), None)] * 2))
    return CountingBlock.calls


def refusals(rank: int, world: int) -> dict:
    """What initialize() says to a pipeline with ZeRO 2 and 3 (DeepSpeed: an AssertionError) and to tied
    weights across stages with bf16's fp32 gradient accumulation."""
    import ds_engine
    from ds_engine.topology import reset_topology
    from ds_pipe import PipelineModule

    out = {}
    base = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}
    cases = {
        2: {"zero_optimization": {"stage": 2}},
        3: {"zero_optimization": {"stage": 3}},
        "bf16_fp32_accum": {"bf16": {"enabled": True, "grad_accum_dtype": "fp32"}},
    }
    for name, extra in cases.items():
        reset_topology()
        model = PipelineModule(specs(), num_stages=2, loss_fn=loss_fn)
        try:
            ds_engine.initialize(model=model, config={**base, **extra})
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out[name] = (type(exc).__mro__[1].__name__, str(exc))
    return out


def checkpoint_roundtrip(rank: int, world: int, stages: int, root: str, resume_stages: int) -> dict:
    """Train 2 steps, save, train 2 more (the reference); then a fresh engine at ``resume_stages`` loads the
    checkpoint and trains the same 2 steps (the optimizer state only when the degree is the same)."""
    import ds_engine
    from ds_engine.topology import reset_topology
    from ds_pipe import PipelineModule

    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
    }

    def engine_at(n):
        reset_topology()
        torch.manual_seed(99 + n)  # different initial weights: the load must replace them
        model = PipelineModule(specs(), num_stages=n, loss_fn=loss_fn)
        return ds_engine.initialize(model=model, config=copy.deepcopy(config))[0]

    data = batches(0, 1, 8)
    engine = engine_at(stages)
    for i in range(2):
        engine.train_batch(iter(data[2 * i : 2 * i + 2]))
    engine.save_checkpoint(root, tag="t", client_state={"note": "kept"})
    after = [float(engine.train_batch(iter(data[2 * i : 2 * i + 2]))) for i in (2, 3)]
    if resume_stages != stages:
        import ds_engine.topology as t
        from ds_engine.topology import build_topology  # noqa: F401 - one topology per job: a new one is refused

        t._CURRENT = None  # a test restarts the job in the same processes
    resumed = engine_at(resume_stages)
    same = resume_stages == stages
    path, client = resumed.load_checkpoint(root, load_optimizer_states=same)
    first = resumed.eval_batch(iter(data[4:6]))
    again = [float(resumed.train_batch(iter(data[2 * i : 2 * i + 2]))) for i in (2, 3)]
    error = None
    if not same:
        try:
            resumed.load_checkpoint(root)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            error = f"{type(exc).__name__}: {exc}"
    return {"after": after, "again": again, "eval": float(first), "client": client, "error": error}


def train_each(rank: int, world: int, stages: int, configs: list[dict], steps: int) -> list[list[float]]:
    """``train`` for each config in turn, in the same processes (one spawn for several precisions)."""
    return [train(rank, world, stages, c, steps)["losses"] for c in configs]
