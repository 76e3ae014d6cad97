"""Rank functions for ds-pipe's own tests: the runner driven by plain SGD hooks over groups the test makes."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

DIM = 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


class SGDHooks:
    """What an engine does, at its simplest: backward, and an SGD step (one data-parallel rank)."""

    def __init__(self, module: nn.Module, micro_batches: int, lr: float = 0.1) -> None:
        self.module, self.gas, self.lr = module, micro_batches, lr

    def backward(self, outputs: Any, grads: Any, last_micro_batch: bool) -> None:
        if grads is None:
            (outputs / self.gas).backward()
        else:
            torch.autograd.backward(outputs, grads)

    def reduce_tied_grads(self) -> None:
        self.module.allreduce_tied_weight_gradients()

    def reduce_grads(self) -> None:
        pass

    def step(self) -> None:
        with torch.no_grad():
            for p in self.module.parameters():
                if p.grad is not None:
                    p -= self.lr * p.grad
                    p.grad = None


def runner(layers: list, stages: int, **kwargs: Any):
    from ds_pipe import PipelineGrid, PipelineModule, PipelineRunner

    torch.manual_seed(0)
    module = PipelineModule(layers, num_stages=stages, loss_fn=lambda o, y: (o - y).pow(2).mean(), **kwargs)
    world = dist.group.WORLD
    grid = PipelineGrid(module.topology(), dist.get_rank(), pipe_group=world, data_group=None)
    module.attach_groups(grid, {})
    return module, PipelineRunner(module, grid, torch.device("cpu"))


def _message(fn) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test reads the message
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def faults(rank: int, world: int, case: str) -> str:
    """One fault at 2 stages; each rank returns the error it raised (or "no error")."""
    from ds_pipe import LayerSpec, PipelineModule

    specs = [LayerSpec(Block) for _ in range(4)]
    if case == "more_stages_than_layers":
        return _message(lambda: PipelineModule(specs[:1], num_stages=2))
    module, run = runner(specs, 2)
    hooks = SGDHooks(module, 4)
    x = torch.randn(2, DIM)
    if case == "shape_change":
        data = [(x, x), (x, x), (torch.randn(3, DIM), torch.randn(3, DIM)), (x, x)]
    elif case == "iterator_ends_early":
        data = [(x, x)] * 3
    elif case == "stage_dies":
        if rank == 1:
            module.forward = lambda _x: os._exit(7)  # the last stage's process dies at its first forward
        data = [(x, x)] * 4
        run.train_batch(iter(data), 4, hooks)  # rank 0 raises: spawn reports its error at once
    elif case == "stage_hangs":
        if rank == 1:
            module.forward = lambda _x: time.sleep(3600)  # alive, but its first forward never ends
        run.timeout = timedelta(seconds=2)  # the engine gives the job's collective timeout
        data = [(x, x)] * 4
        run.train_batch(iter(data), 4, hooks)  # rank 0 raises: spawn reports its error at once
    else:
        raise ValueError(case)
    return _message(lambda: run.train_batch(iter(data), 4, hooks))
