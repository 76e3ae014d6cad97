"""An Accelerate training loop with a DeepSpeed config, in Accelerate's documented style
(``Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=...))``), launched with torchrun.

A small MLP on synthetic data, no hub access. Rank 0 prints {"step": n, "loss": x} per step and, at the
end, {"weights": {name: sum}} of ``accelerator.get_state_dict(model)``. ``--save-at N`` calls
``save_state`` after step N; ``--resume DIR --from-step N`` calls ``load_state`` and continues from step N+1.
Usage:
  DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 accelerate_script.py --stage 2 --out DIR

On CPU Accelerate finds no distributed backend for the device and runs each process alone; the one
adjustment here tells it gloo serves the CPU (the same for DeepSpeed and ds; no deepspeed name is touched).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

GLOBAL_BATCH = 4


def data(n: int = 64) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    return torch.utils.data.TensorDataset(x, (x @ torch.randn(16, 4, generator=g)).tanh())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--resume", default=None)
    p.add_argument("--from-step", type=int, default=0, help="with --resume: the step the state was saved at")
    args = p.parse_args()
    import accelerate.state
    from accelerate import Accelerator, DeepSpeedPlugin

    # the CPU adjustment (see the module docstring)
    accelerate.state.get_torch_accelerator_backend = lambda *args, **kwargs: ("cpu", None)
    accelerate.state.get_distributed_backend = lambda device: "gloo"

    micro = GLOBAL_BATCH // int(os.environ["WORLD_SIZE"])
    ds_config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.stage, "stage3_gather_16bit_weights_on_model_save": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
    }
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    loader = torch.utils.data.DataLoader(data(), batch_size=micro, shuffle=False)
    from accelerate.utils import DummyOptim

    optimizer = DummyOptim(model.parameters())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if args.resume:
        accelerator.load_state(args.resume)
    batches = iter(loader)
    for _ in range(args.from_step):
        next(batches)
    for step in range(args.from_step + 1, args.steps + 1):
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        mean = accelerator.reduce(loss.detach(), reduction="mean").item()
        if accelerator.is_main_process:
            print(json.dumps({"step": step, "loss": mean}), flush=True)
        if step == args.save_at:
            accelerator.save_state(str(Path(args.out) / "state"))
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        print(
            json.dumps({"weights": {k: v.double().sum().item() for k, v in sorted(state.items())}}),
            flush=True,
        )


if __name__ == "__main__":
    main()
