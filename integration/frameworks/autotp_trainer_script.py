"""The Hugging Face Trainer with ``tensor_parallel.autotp_size`` in its DeepSpeed config (AutoTP training, the
Trainer's documented way): a tiny Llama from its config, synthetic tokens. The Trainer calls
``deepspeed.tp_model_init`` and gives the ranks of one tensor-parallel group the same batches. Rank 0 prints
{"step": n, "loss": x} per step; with --save, ``Trainer.save_model`` writes the whole weights, which rank 0
loads into the plain (unsplit) Llama and prints {"weights": {name: sum}, "loads": true}. Usage:
  torchrun --nproc_per_node 2 autotp_trainer_script.py --tp 2 --out DIR [--save]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64, length: int = 12, vocab: int = 64) -> None:
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class PrintLoss(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN201
        if state.is_world_process_zero and logs and "loss" in logs:
            print(json.dumps({"step": state.global_step, "loss": logs["loss"]}), flush=True)


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, attn_implementation="eager",
    )  # fmt: skip
    return LlamaForCausalLM(config)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--save", action="store_true")
    args = p.parse_args()
    ds_config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "zero_optimization": {"stage": 1, "stage3_gather_16bit_weights_on_model_save": True},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        "tensor_parallel": {"autotp_size": args.tp},
    }
    training_args = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=2, max_steps=args.steps, learning_rate=1e-2,
        logging_steps=1, save_strategy="no", report_to=[], deepspeed=ds_config, use_cpu=True, seed=0,
        dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Trainer(model=llama(), args=training_args, train_dataset=Tokens(), callbacks=[PrintLoss()])
    trainer.train()
    if args.save:
        trainer.save_model(args.out)
        if int(os.environ.get("RANK", "0")) == 0:
            state = load_file(str(Path(args.out) / "model.safetensors"))
            plain = llama()
            missing, unexpected = plain.load_state_dict(state, strict=False)
            loads = not unexpected and set(missing) <= {"lm_head.weight"}  # a tied head is saved once
            sums = {k: v.float().sum().item() for k, v in state.items()}
            print(
                json.dumps(
                    {
                        "weights": sums,
                        "loads": loads,
                        "shapes_whole": plain.model.layers[0].self_attn.q_proj.weight.shape[0]
                        == state["model.layers.0.self_attn.q_proj.weight"].shape[0],
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
