"""Hugging Face mixture-of-experts models (tiny configs built in code, no hub access) under a DeepSpeed
config's ZeRO stage, at 2 ranks (torchrun, gloo, CPU).

Mixtral goes through Accelerate with ``DeepSpeedPlugin(transformer_moe_cls_names=...)`` (which calls
``deepspeed.utils.set_z3_leaf_modules``); Qwen3-MoE and DeepSeek-V3 through ``deepspeed.initialize`` after
``set_z3_leaf_modules`` on their MoE block. Each rank trains on its own tokens, so ranks route to different
experts. Rank 0 prints {"model": m, "step": n, "loss": x} per step (the ranks' mean) and
{"model": m, "leaf_modules": k}. Usage:
  HF_HUB_OFFLINE=1 DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 hf_moe_script.py --stage 3
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

VOCAB, SEQ, MICRO = 64, 8, 2
COMMON = dict(
    vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, max_position_embeddings=32, num_experts_per_tok=2,
)  # fmt: skip


def build(name: str) -> tuple[torch.nn.Module, str]:
    """The model (seeded) and its MoE block's class name."""
    import transformers as t

    torch.manual_seed(0)
    if name == "mixtral":
        cfg = t.MixtralConfig(**COMMON, num_local_experts=4)
        return t.MixtralForCausalLM(cfg), "MixtralSparseMoeBlock"
    if name == "qwen3_moe":
        cfg = t.Qwen3MoeConfig(**COMMON, num_experts=4, moe_intermediate_size=16, head_dim=8)
        return t.Qwen3MoeForCausalLM(cfg), "Qwen3MoeSparseMoeBlock"
    cfg = t.DeepseekV3Config(
        **COMMON, n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=16, first_k_dense_replace=1,
        n_group=2, topk_group=1, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4,
        v_head_dim=8,
    )  # fmt: skip
    return t.DeepseekV3ForCausalLM(cfg), "DeepseekV3MoE"


def tokens(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    # each rank draws from its own half of the vocabulary: its tokens route differently
    lo = (rank % 2) * VOCAB // 2
    return torch.randint(lo, lo + VOCAB // 2, (MICRO, SEQ), generator=g)


def config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "gradient_clipping": 1.0,
    }


def report(name: str, step: int, loss: torch.Tensor) -> None:
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    if dist.get_rank() == 0:
        print(
            json.dumps({"model": name, "step": step, "loss": mean.item() / dist.get_world_size()}), flush=True
        )


def with_accelerate(name: str, stage: int, steps: int) -> None:
    import accelerate.state
    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.utils import DummyOptim

    # on CPU Accelerate finds no backend for the device; gloo serves it (no deepspeed name is touched)
    accelerate.state.get_torch_accelerator_backend = lambda *args, **kwargs: ("cpu", None)
    accelerate.state.get_distributed_backend = lambda device: "gloo"
    model, block = build(name)
    plugin = DeepSpeedPlugin(hf_ds_config=config(stage), transformer_moe_cls_names=block)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model, optimizer = accelerator.prepare(model, DummyOptim(model.parameters()))
    leaf(name, model)
    rank = dist.get_rank()
    for step in range(1, steps + 1):
        ids = tokens(step, rank)
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        report(name, step, loss)


def with_initialize(name: str, stage: int, steps: int) -> None:
    import deepspeed
    from deepspeed.utils import set_z3_leaf_modules

    model, block = build(name)
    set_z3_leaf_modules(model, [block])
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(stage))
    leaf(name, engine.module)
    rank = dist.get_rank()
    for step in range(1, steps + 1):
        ids = tokens(step, rank)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        report(name, step, loss)


def leaf(name: str, model: torch.nn.Module) -> None:
    from deepspeed.utils import get_z3_leaf_modules

    if dist.get_rank() == 0:
        print(json.dumps({"model": name, "leaf_modules": len(get_z3_leaf_modules(model))}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--models", default="mixtral,qwen3_moe,deepseek_v3")
    args = p.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for name in args.models.split(","):
        if name == "mixtral":
            with_accelerate(name, args.stage, args.steps)
        else:
            with_initialize(name, args.stage, args.steps)


if __name__ == "__main__":
    main()
