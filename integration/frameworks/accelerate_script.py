"""An Accelerate training loop with a DeepSpeed config, in Accelerate's documented style
(``Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=...))``), launched with torchrun.

A small MLP on synthetic data, no hub access. Rank 0 prints {"step": n, "loss": x} per step and, at the
end, {"weights": {name: sum}} of ``accelerator.get_state_dict(model)``. ``--save-at N`` calls
``save_state`` after step N; ``--resume DIR --from-step N`` calls ``load_state`` and continues from step N+1.
The last line rank 0 prints is {"step_seconds": [...]}: its wall time of each step (forward, backward,
optimizer step, zero_grad; the loss's all-reduce for printing is left out). ``--ddp`` runs Accelerate's
plain DDP with torch's AdamW, clipping gradients at 1.0 as DeepSpeed does by default (no DeepSpeed plugin;
the benchmark's baseline, tools/bench/bench_frameworks.py); ``--width``/``--layers`` size the MLP (defaults: the
tests' tiny one). The data repeats once it runs out.
Usage:
  DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 accelerate_script.py --stage 2 --out DIR

On CPU Accelerate finds no distributed backend for the device and runs each process alone; the one
adjustment here tells it gloo serves the CPU (the same for DeepSpeed and ds; no deepspeed name is touched).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from launch import offload_to_nvme

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
    p.add_argument("--ddp", action="store_true", help="Accelerate's DDP, no DeepSpeed (benchmark baseline)")
    p.add_argument("--width", type=int, default=32, help="hidden width (the benchmark uses a larger one)")
    p.add_argument("--layers", type=int, default=1, help="hidden layers")
    p.add_argument(
        "--nvme", action="store_true", help="ZeRO-3 with parameters and optimizer on nvme under OUT/nvme"
    )
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
    if args.nvme:
        offload_to_nvme(ds_config["zero_optimization"], args.out)
    accelerator = Accelerator(deepspeed_plugin=None if args.ddp else DeepSpeedPlugin(hf_ds_config=ds_config))
    torch.manual_seed(0)
    hidden = []
    for _ in range(args.layers - 1):
        hidden += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    model = torch.nn.Sequential(
        torch.nn.Linear(16, args.width), torch.nn.GELU(), *hidden, torch.nn.Linear(args.width, 4)
    )
    if accelerator.is_main_process:  # the parameter count, before any engine partitions it
        print(json.dumps({"numel": sum(p.numel() for p in model.parameters())}), flush=True)
    loader = torch.utils.data.DataLoader(data(), batch_size=micro, shuffle=False)
    from accelerate.utils import DummyOptim

    if args.ddp:  # the optimizer the DeepSpeed config names, built by hand
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    else:
        optimizer = DummyOptim(model.parameters())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if args.resume:
        accelerator.load_state(args.resume)

    def repeat():  # noqa: ANN202
        while True:
            yield from loader

    batches = repeat()
    for _ in range(args.from_step):
        next(batches)
    step_seconds = []
    for step in range(args.from_step + 1, args.steps + 1):
        x, y = next(batches)
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        if args.ddp:  # what the DeepSpeed engine does by default (its gradient_clipping is 1.0)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        step_seconds.append(time.perf_counter() - t0)
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
        print(json.dumps({"step_seconds": step_seconds}), flush=True)


if __name__ == "__main__":
    main()
