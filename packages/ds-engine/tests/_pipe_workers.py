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
    """Train the tied model at ``stages`` for ``steps`` batches; what rank 0 printed comes back too."""
    import contextlib
    import io

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
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        losses = [float(engine.train_batch(mine)) for _ in range(steps)]
    engine.destroy()  # closes the monitor's files
    return {
        "losses": losses,
        "printed": printed.getvalue(),
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


class Plain(nn.Module):
    """The same model without a pipeline: the layers seeded as ``seed_layers`` seeds them, one embedding used
    twice (the tied input and output)."""

    def __init__(self, n_blocks: int = 4, base: int = 1234) -> None:
        super().__init__()
        torch.manual_seed(base)
        self.embed = Embed()
        blocks = []
        for idx in range(1, n_blocks + 1):
            torch.manual_seed(base + idx)
            blocks.append(Block())
        self.blocks = nn.Sequential(*blocks)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return head(self.embed, self.blocks(self.embed(ids)))


def plain_losses(rank: int, world: int, config: dict, steps: int, pipe_gas: int, pipe_dp: int) -> list[float]:
    """The plain model under the ordinary engine on every rank of the job (data parallel only), reading the
    micro-batches a pipeline of ``pipe_dp`` data-parallel ranks x ``pipe_gas`` micro-batches read in each
    step; returns each step's mean loss over all ranks' micro-batches (the pipeline's returned loss)."""
    import ds_engine
    import torch.distributed as dist
    from ds_engine.topology import reset_topology

    reset_topology()
    gas = pipe_gas * pipe_dp // world  # the same micro-batches per step, spread over every rank
    model = Plain()
    cfg = {**copy.deepcopy(config), "gradient_accumulation_steps": gas}
    engine, *_ = ds_engine.initialize(model=model, config=cfg, model_parameters=model.parameters())
    data = batches(0, pipe_dp, steps * pipe_gas)
    per_dp = world // pipe_dp  # this many ranks share a pipeline data-parallel rank's micro-batches
    d, h = divmod(rank, per_dp)
    out = []
    for step in range(steps):
        first = d * steps * pipe_gas + step * pipe_gas + h * gas
        total = torch.zeros(())
        for x, y in data[first : first + gas]:
            loss = loss_fn(engine(x), y)
            engine.backward(loss)
            engine.step()
            total += loss.detach() / gas
        dist.all_reduce(total)
        out.append(float(total) / world)
    return out


def two_ranks(rank: int, world: int, root: str, config: dict, steps: int) -> dict:
    """Everything test_pipeline.py asks of 2 ranks, in one spawn (each start costs seconds of imports):
    fp32 at 2 stages with steps_per_print and the csv monitor; bf16 and fp16; the refusals; checkpoints at
    the same and at another degree; the activation_checkpoint_interval key."""
    import os

    monitor = {"enabled": True, "output_path": os.path.join(root, "monitor"), "job_name": "pipe"}
    out: dict[str, Any] = {}
    out["fp32"] = train(rank, world, 2, {**config, "steps_per_print": 1, "csv_monitor": monitor}, steps)
    out["bf16"] = train(rank, world, 2, {**config, "bf16": {"enabled": True}}, steps)["losses"]
    out["fp16"] = train(
        rank, world, 2, {**config, "fp16": {"enabled": True, "initial_scale_power": 12}}, steps
    )["losses"]
    out["refusals"] = refusals(rank, world)
    out["checkpoint_same"] = checkpoint_roundtrip(rank, world, 2, os.path.join(root, "same"), 2)
    out["checkpoint_other"] = checkpoint_roundtrip(rank, world, 2, os.path.join(root, "other"), 1)
    base = {k: config[k] for k in ("train_micro_batch_size_per_gpu", "optimizer")}
    base["gradient_accumulation_steps"] = 2
    out["act_ckpt"] = (
        checkpoint_interval_calls(rank, world, base),
        checkpoint_interval_calls(rank, world, {**base, "pipeline": {"activation_checkpoint_interval": 1}}),
    )
    return out


def four_ranks(rank: int, world: int, config: dict, steps: int) -> dict:
    """2 stages x 2 data-parallel ranks: fp32, and ZeRO-1 beside the plain model's ZeRO-1 over all 4 ranks."""
    zero1 = {**config, "zero_optimization": {"stage": 1}}
    return {
        "fp32": train(rank, world, 2, config, steps),
        "zero1": train(rank, world, 2, zero1, steps),
        "plain_zero1": plain_losses(rank, world, zero1, steps, config["gradient_accumulation_steps"], 2),
    }
