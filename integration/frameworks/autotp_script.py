"""AutoTP training as a DeepSpeed user writes it: a tiny Hugging Face Llama from a config in code,
``"tensor_parallel": {"autotp_size": N}`` in the DeepSpeed config, ``deepspeed.initialize``. Ranks of one
tensor-parallel group read the same batch (DeepSpeed requires it); the data-parallel ranks read their rows
of the global batch. Rank 0 prints one JSON line per step, then the whole weights' sums when asked to save.

    torchrun --nproc_per_node 4 autotp_script.py --tp 2 --zero 2 [--bf16] [--clip 1.0] [--vocab] [--save DIR]

``--vocab`` sets ``vocab_parallel_lm_head``: the head split over the vocabulary, its logits left split (rank 0
prints their width) and the loss computed vocab-parallel.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import deepspeed
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--tp", type=int, default=1)
p.add_argument("--zero", type=int, default=1)
p.add_argument("--bf16", action="store_true")
p.add_argument("--fp16", action="store_true")
p.add_argument("--clip", type=float, default=0.0)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--micro", type=int, default=2)
p.add_argument("--overlap", action="store_true")
p.add_argument("--vocab", action="store_true", help="tensor_parallel.vocab_parallel_lm_head: true")
p.add_argument("--save", default="")
p.add_argument("--width", type=int, default=32, help="hidden size (the benchmark's is larger)")
p.add_argument("--layers", type=int, default=2)
p.add_argument("--seq", type=int, default=12)
p.add_argument("--report", action="store_true", help="print bytes per rank and step times (the benchmark)")
p.add_argument("--local_rank", type=int, default=-1)
args = p.parse_args()

deepspeed.init_distributed(dist_backend="gloo")
world, rank = dist.get_world_size(), dist.get_rank()
dp = world // args.tp
torch.manual_seed(0)
model = LlamaForCausalLM(
    LlamaConfig(
        vocab_size=64 if args.width == 32 else 1024, hidden_size=args.width, intermediate_size=2 * args.width,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max(32, args.seq), attn_implementation="eager",
    )
)  # fmt: skip
head = {"vocab_parallel_lm_head": True} if args.vocab else {}
config = {
    "train_micro_batch_size_per_gpu": args.micro,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0, "torch_adam": True}},
    "zero_optimization": {"stage": args.zero},
    "gradient_clipping": args.clip,
    "bf16": {"enabled": args.bf16},
    "fp16": {"enabled": args.fp16, "initial_scale_power": 8},
    "tensor_parallel": {"autotp_size": args.tp, "tp_overlap_comm": args.overlap, **head},
    "steps_per_print": 1000,
}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
if rank == 0:  # the split is real on both sides: q_proj holds hidden/tp rows per rank
    print(
        json.dumps({"q_proj_rows": engine.module.model.layers[0].self_attn.q_proj.weight.shape[0]}),
        flush=True,
    )
dp_rank = rank // args.tp
vocab = model.config.vocab_size
seconds = []
for step in range(args.steps):
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, vocab, (args.micro * dp, args.seq), generator=g)
    ids = ids[dp_rank * args.micro : (dp_rank + 1) * args.micro]
    t0 = time.perf_counter()
    out = engine(input_ids=ids, labels=ids)
    loss = out.loss
    if step == 0 and rank == 0 and args.vocab:  # this rank's slice of the vocabulary
        print(json.dumps({"logits_cols": out.logits.shape[-1]}), flush=True)
    engine.backward(loss)
    engine.step()
    seconds.append(time.perf_counter() - t0)
    mean = loss.detach().float().clone()
    dist.all_reduce(mean)
    if rank == 0:
        norm = engine.get_global_grad_norm()  # the norm clipping used: over the whole model
        norm = float(norm) if norm is not None else None
        print(json.dumps({"step": step, "loss": mean.item() / world, "grad_norm": norm}), flush=True)
if args.report and rank == 0:
    linear = {
        n for n, m in engine.module.named_modules() if n.startswith("model.layers.") and hasattr(m, "weight")
    }
    split = sum(
        p.numel() * p.element_size()
        for n, p in engine.module.named_parameters()
        if n.rsplit(".", 1)[0] in linear and "layernorm" not in n
    )
    inner = engine.optimizer
    while not isinstance(inner, torch.optim.Optimizer) and hasattr(inner, "optimizer"):
        inner = inner.optimizer
    state = sum(
        t.numel() * t.element_size() for s in inner.state.values() for t in s.values() if torch.is_tensor(t)
    )
    names = {id(p): n for n, p in engine.module.named_parameters()}  # per parameter at ZeRO 0 (fp32)
    split_state = sum(
        t.numel() * t.element_size()
        for p, s in inner.state.items()
        if names.get(id(p), "").rsplit(".", 1)[0] in linear and "layernorm" not in names[id(p)]
        for t in s.values()
        if torch.is_tensor(t) and t.dim() > 0
    )
    report = {
        "split_layer_param_bytes": split,
        "split_layer_optimizer_bytes": split_state,
        "optimizer_state_bytes": state,
        "step_seconds": seconds,
    }
    print(json.dumps(report), flush=True)
if args.save:
    engine.save_16bit_model(args.save)
    if rank == 0:
        state = torch.load(os.path.join(args.save, "pytorch_model.bin"))
        print(json.dumps({"weights": {k: v.float().sum().item() for k, v in state.items()}}), flush=True)
