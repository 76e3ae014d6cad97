"""AutoTP training as a DeepSpeed user writes it: a tiny Hugging Face Llama from a config in code,
``"tensor_parallel": {"autotp_size": N}`` in the DeepSpeed config, ``deepspeed.initialize``. Ranks of one
tensor-parallel group read the same batch (DeepSpeed requires it); the data-parallel ranks read their rows
of the global batch. Rank 0 prints one JSON line per step, then the whole weights' sums when asked to save.

    torchrun --nproc_per_node 4 autotp_script.py --tp 2 --zero 2 [--bf16] [--clip 1.0] [--save DIR]
"""

from __future__ import annotations

import argparse
import json
import os

import deepspeed
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--tp", type=int, default=1)
p.add_argument("--zero", type=int, default=1)
p.add_argument("--bf16", action="store_true")
p.add_argument("--clip", type=float, default=0.0)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--micro", type=int, default=2)
p.add_argument("--overlap", action="store_true")
p.add_argument("--save", default="")
p.add_argument("--local_rank", type=int, default=-1)
args = p.parse_args()

deepspeed.init_distributed(dist_backend="gloo")
world, rank = dist.get_world_size(), dist.get_rank()
dp = world // args.tp
torch.manual_seed(0)
model = LlamaForCausalLM(
    LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, attn_implementation="eager",
    )
)  # fmt: skip
config = {
    "train_micro_batch_size_per_gpu": args.micro,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0, "torch_adam": True}},
    "zero_optimization": {"stage": args.zero},
    "gradient_clipping": args.clip,
    "bf16": {"enabled": args.bf16},
    "tensor_parallel": {"autotp_size": args.tp, "tp_overlap_comm": args.overlap},
    "steps_per_print": 1000,
}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
dp_rank = rank // args.tp
for step in range(args.steps):
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, 64, (args.micro * dp, 12), generator=g)[
        dp_rank * args.micro : (dp_rank + 1) * args.micro
    ]
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    mean = loss.detach().float().clone()
    dist.all_reduce(mean)
    if rank == 0:
        print(json.dumps({"step": step, "loss": mean.item() / world}), flush=True)
if args.save:
    engine.save_16bit_model(args.save)
    if rank == 0:
        state = torch.load(os.path.join(args.save, "pytorch_model.bin"))
        print(json.dumps({"weights": {k: v.float().sum().item() for k, v in state.items()}}), flush=True)
