"""A Hugging Face Trainer run with DeepSpeed sequence parallelism (ALST), in Accelerate's documented style:
``ParallelismConfig(sp_size=2, sp_backend="deepspeed")`` in the TrainingArguments and a DeepSpeed config.

Tiny Llama from its config (sdpa attention), synthetic tokens with position_ids, no hub access. Prints one JSON
line per logged step on rank 0: {"step": n, "loss": x}. Usage:
  HF_HUB_OFFLINE=1 DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 trainer_sp_script.py --stage 2 --out DIR
"""

from __future__ import annotations

import argparse
import json

import torch
from accelerate.parallelism_config import ParallelismConfig
from accelerate.utils import DeepSpeedSequenceParallelConfig
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

SEQ = 16


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 16, vocab: int = 64) -> None:
        self.ids = torch.randint(0, vocab, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i], "position_ids": torch.arange(SEQ)}


class PrintLoss(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN201
        # under sequence parallelism every rank of the first sequence group is "world process zero": global rank 0
        if torch.distributed.get_rank() == 0 and logs and "loss" in logs:
            print(json.dumps({"step": state.global_step, "loss": logs["loss"]}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--sp", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    ds_config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {"stage": args.stage},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    }
    parallelism = ParallelismConfig(
        sp_size=args.sp,
        sp_backend="deepspeed",
        sp_handler=DeepSpeedSequenceParallelConfig(
            sp_seq_length=SEQ, sp_seq_length_is_variable=False, sp_attn_implementation="sdpa"
        ),
    )
    training = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=1, learning_rate=1e-2, max_steps=6, logging_steps=1,
        report_to=[], save_strategy="no", deepspeed=ds_config, parallelism_config=parallelism,
        dataloader_drop_last=True,
    )  # fmt: skip
    Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=[PrintLoss()]).train()


if __name__ == "__main__":
    main()
