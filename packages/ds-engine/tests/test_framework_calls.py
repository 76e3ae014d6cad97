"""Engine calls the frameworks make (Trainer, Accelerate, Lightning) with DeepSpeed's meaning."""

from __future__ import annotations

import ds_engine
import torch

CFG = {
    "train_batch_size": 4,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "SGD", "params": {"lr": 0.5}},
}


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def _step(divide_here: bool) -> torch.Tensor:
    """One optimizer step over two micro-batches; the loss divided by the script or by the engine."""
    engine, *_ = ds_engine.initialize(model=_net(), config=dict(CFG))
    torch.manual_seed(1)
    for _ in range(2):
        loss = engine(torch.randn(2, 3)).pow(2).mean()
        if divide_here:
            engine.backward(loss / 2, scale_wrt_gas=False)
        else:
            engine.backward(loss)
        engine.step()
    return engine.module.weight.detach().clone()


def test_backward_scale_wrt_gas_false_leaves_the_loss_undivided():
    """The Trainer divides by the accumulation steps itself and passes ``scale_wrt_gas=False``."""
    torch.testing.assert_close(_step(divide_here=True), _step(divide_here=False), rtol=0, atol=0)


def test_steps_per_print_inf_means_never():
    """Accelerate silences DeepSpeed's progress log with ``steps_per_print: float("inf")``."""
    engine, *_ = ds_engine.initialize(model=_net(), config={**CFG, "steps_per_print": float("inf")})
    assert engine.steps_per_print() > 2**62
