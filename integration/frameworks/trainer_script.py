"""A Hugging Face Trainer run with a DeepSpeed config, in the Trainer's documented style (torchrun).

Tiny GPT-2 built from its config, synthetic tokens, no hub access. Prints one JSON line per logged
step on rank 0: {"step": n, "loss": x}; with --save, ``Trainer.save_model`` then runs and rank 0 prints
{"weights": {name: sum}} of the safetensors file it wrote (at ZeRO-3 the 16-bit gather on save). Its last
line is {"step_seconds": [...]}: rank 0's wall time of each optimizer step (``on_step_begin`` to
``on_step_end``: forward, backward, optimizer step). ``--ddp`` trains with the Trainer's own DDP instead of
DeepSpeed (the benchmark's baseline, tools/bench/bench_frameworks.py; it clips gradients at 1.0 as DeepSpeed
does by default); ``--width``/``--layers`` size the model (defaults: the tests' tiny one). ``--nvme`` (ZeRO-3)
puts the parameters and the optimizer state on ``nvme`` with ``nvme_path`` ``OUT/nvme`` (ZeRO-Infinity:
``max_in_cpu`` 0 and no persistent parameters, so every partition goes to the files). Usage:
  HF_HUB_OFFLINE=1 DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 trainer_script.py --stage 2 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from launch import offload_to_nvme
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64, length: int = 16, vocab: int = 128) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class PrintLoss(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN201
        if state.is_world_process_zero and logs and "loss" in logs:
            record = {"step": state.global_step, "loss": logs["loss"], "grad_norm": logs.get("grad_norm")}
            print(json.dumps(record), flush=True)


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step: forward, backward and the optimizer (or engine) step."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self.seconds.append(time.perf_counter() - self._t0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=2, help="per-rank micro batch")
    p.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: never)")
    p.add_argument("--resume", default=None, help="a checkpoint folder to resume_from_checkpoint")
    p.add_argument("--save", action="store_true", help="save_model at the end and print the weights' sums")
    p.add_argument(
        "--ddp", action="store_true", help="the Trainer's DDP instead of DeepSpeed (benchmark baseline)"
    )
    p.add_argument("--width", type=int, default=32, help="n_embd (the benchmark uses a larger one)")
    p.add_argument("--layers", type=int, default=2, help="n_layer")
    p.add_argument(
        "--offload", action="store_true", help="offload the optimizer (and at ZeRO-3 the parameters)"
    )
    p.add_argument(
        "--nvme", action="store_true", help="ZeRO-3 with parameters and optimizer on nvme under OUT/nvme"
    )
    args = p.parse_args()
    ds_config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "zero_optimization": {"stage": args.stage, "stage3_gather_16bit_weights_on_model_save": True},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    }
    if args.offload:
        ds_config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        if args.stage == 3:
            ds_config["zero_optimization"]["offload_param"] = {"device": "cpu"}
    if args.nvme:
        offload_to_nvme(ds_config["zero_optimization"], args.out)
    training_args = TrainingArguments(
        output_dir=args.out,
        per_device_train_batch_size=args.batch,
        max_steps=args.steps,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to=[],
        deepspeed=None
        if args.ddp
        else ds_config,  # DDP clips at max_grad_norm 1.0 as DeepSpeed's default does
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    torch.manual_seed(0)
    # no dropout: a run resumed at another world size draws no per-rank random masks
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    config = GPT2Config(
        vocab_size=128, n_positions=16, n_embd=args.width, n_layer=args.layers, n_head=2, **no_dropout
    )
    model = GPT2LMHeadModel(config)
    if int(os.environ.get("RANK", "0")) == 0:  # the parameter count, before any engine partitions it
        print(json.dumps({"numel": sum(p.numel() for p in model.parameters())}), flush=True)
    timer = StepTimer()
    trainer = Trainer(model=model, args=training_args, train_dataset=Tokens(), callbacks=[PrintLoss(), timer])
    trainer.train(resume_from_checkpoint=args.resume)
    if args.save:
        final = Path(args.out) / "final"
        trainer.save_model(str(final))
        if trainer.is_world_process_zero():
            tensors = load_file(final / "model.safetensors")
            print(json.dumps({"weights": {k: v.double().sum().item() for k, v in sorted(tensors.items())}}))
    if trainer.is_world_process_zero():
        if not args.ddp:  # the optimizer the engine built from the config (a CPU Adam under offload)
            print(json.dumps({"optimizer": type(trainer.model_wrapped.basic_optimizer).__name__}), flush=True)
        print(json.dumps({"step_seconds": timer.seconds}), flush=True)


if __name__ == "__main__":
    main()
