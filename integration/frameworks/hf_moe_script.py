"""Hugging Face mixture-of-experts models (tiny configs built in code, no hub access) under a DeepSpeed
config's ZeRO stage, at 2 or 4 ranks (torchrun, gloo, CPU).

``mixtral_trainer`` is an unmodified ``Trainer`` given the config: its MoE blocks are leaves by the defaults
of the config's ``zero_optimization.leaf_module`` section (DeepSpeed 0.19.8's: Mixtral's, Qwen2-MoE's and
Qwen3-MoE's sparse MoE blocks), or with ``--moe-env`` also from ``ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES``,
as ``accelerate launch --deepspeed_moe_layer_cls_names`` sets it;
``mixtral`` goes through Accelerate with ``DeepSpeedPlugin(transformer_moe_cls_names=...)`` (which calls
``deepspeed.utils.set_z3_leaf_modules``); Qwen3-MoE and DeepSeek-V3 through ``deepspeed.initialize`` after
``set_z3_leaf_modules`` on their MoE block. These three turn the section's defaults off
(``"leaf_module": {"classes": []}``), so their leaves come from the marking under test alone. Each rank trains on tokens from its own half of the vocabulary,
so ranks route to different experts. Rank 0 prints {"model": m, "step": n, "loss": x} per step (the ranks'
mean) and {"model": m, "leaf_modules": k, "leaf_params": p}; the Trainer's run also the tokens each rank
routed to each expert and (ds's stage 3) the gathers of MoE-block parameters per step. Usage:
  HF_HUB_OFFLINE=1 DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 hf_moe_script.py --stage 3 --moe-env
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

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


def config(stage: int, leaf_defaults: bool = True) -> dict:
    """``leaf_defaults=False``: no zero_optimization.leaf_module defaults (the leaves are the caller's)."""
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0}
    if not leaf_defaults:
        zero["leaf_module"] = {"classes": []}
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
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
    plugin = DeepSpeedPlugin(hf_ds_config=config(stage, leaf_defaults=False), transformer_moe_cls_names=block)
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
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config(stage, leaf_defaults=False)
    )
    leaf(name, engine.module)
    rank = dist.get_rank()
    for step in range(1, steps + 1):
        ids = tokens(step, rank)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        report(name, step, loss)


class Tokens(torch.utils.data.Dataset):
    """The Trainer's data: item ``i`` is ``tokens(i + 1, rank)``'s first row on this rank, so each rank's
    tokens come from its own half of the vocabulary as in the other paths."""

    def __init__(self, n: int) -> None:
        self.rank, self.n = int(os.environ.get("RANK", "0")), n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        ids = tokens(i + 1, self.rank)[0]
        return {"input_ids": ids, "labels": ids}


def with_trainer(name: str, stage: int, steps: int, out: str, moe_env: bool) -> None:
    """An unmodified ``Trainer`` given the DeepSpeed config. The leaf modules come from the defaults of the
    config's ``zero_optimization.leaf_module`` section (the engine marks Mixtral's, Qwen2-MoE's and
    Qwen3-MoE's blocks at initialize, as DeepSpeed 0.19.8's does); ``moe_env`` also sets
    ``ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES`` to the MoE block's class, what ``accelerate launch
    --deepspeed_moe_layer_cls_names`` sets (transformers 5.25 builds its DeepSpeedPlugin without
    ``transformer_moe_cls_names``, so Accelerate 1.16 reads that variable when the Trainer prepares the
    model; neither reads ``_no_split_modules``). Rank 0 prints each logged step's
    loss (the ranks' mean), the leaf modules, how many tokens each rank sent to each expert in the first
    step, and under ds's stage 3 each step's gathers of MoE-block parameters."""
    import accelerate.state
    from transformers import Trainer, TrainerCallback, TrainingArguments

    model_name = name.removesuffix("_trainer")
    ds_config = config(stage)
    ds_config.update(train_micro_batch_size_per_gpu="auto", gradient_accumulation_steps="auto")
    ds_config["optimizer"]["params"] = {"lr": "auto", "weight_decay": "auto"}
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=MICRO, max_steps=steps,
        learning_rate=1e-2, weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, save_strategy="no",
        report_to=[], deepspeed=ds_config, use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    model, block_name = build(model_name)
    if moe_env:
        os.environ["ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES"] = block_name
    blocks = [m for m in model.modules() if type(m).__name__ == block_name]
    owner = {id(p): i for i, b in enumerate(blocks) for p in b.parameters()}
    sizes = [len(list(b.parameters())) for b in blocks]
    gathers: list[list[tuple[int, bool]]] = []  # per step, per gather of block parameters: (blocks, whole)
    routed: list[torch.Tensor] = []  # the first step's tokens per expert, per block

    def count_routes(module, inputs) -> None:  # noqa: ANN001
        if len(routed) < len(blocks):
            routed.append(torch.bincount(inputs[1].flatten(), minlength=module.num_experts))

    for b in blocks:
        b.experts.register_forward_pre_hook(count_routes)

    def counted(fetch):  # noqa: ANN001, ANN202
        def fetch_counted(slots):  # noqa: ANN001, ANN202
            mine = [owner[id(s.param)] for s in slots if id(s.param) in owner]
            if mine:
                whole = all(mine.count(i) == sizes[i] for i in set(mine))
                gathers[-1].append((len(set(mine)), whole))
            return fetch(slots)

        return fetch_counted

    class Record(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            schedule = getattr(getattr(trainer.model_wrapped, "optimizer", None), "schedule", None)
            if schedule is not None and not gathers:  # ds's stage 3 (DeepSpeed's has none)
                schedule.fetch = counted(schedule.fetch)
            gathers.append([])

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN201
            if state.is_world_process_zero and logs and "loss" in logs:
                print(
                    json.dumps({"model": name, "step": state.global_step, "loss": logs["loss"]}), flush=True
                )

    trainer = Trainer(model=model, args=args, train_dataset=Tokens(2 * steps * MICRO), callbacks=[Record()])
    trainer.train()
    if moe_env:
        del os.environ["ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES"]
    leaf(name, model)
    mine = torch.stack(routed)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    if dist.get_rank() == 0:
        print(json.dumps({"model": name, "routed": [t.tolist() for t in every]}), flush=True)
        if gathers and any(gathers):
            per_step = [{"gathers": len(g), "blocks": sum(n for n, _ in g), "whole": all(w for _, w in g)}
                        for g in gathers]  # fmt: skip
            print(json.dumps({"model": name, "block_gathers": per_step, "blocks": len(blocks)}), flush=True)
    accelerate.state.AcceleratorState._reset_state(True)  # the next path builds its own Accelerator


def leaf(name: str, model: torch.nn.Module) -> None:
    from deepspeed.utils import get_z3_leaf_modules, z3_leaf_parameter

    if dist.get_rank() == 0:
        leaf_params = sum(z3_leaf_parameter(p) for p in model.parameters())
        record = {"model": name, "leaf_modules": len(get_z3_leaf_modules(model)), "leaf_params": leaf_params}
        print(json.dumps(record), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stage", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--models", default="mixtral_trainer,mixtral,qwen3_moe,deepseek_v3")
    p.add_argument("--out", default=None, help="the Trainer's output_dir (default: a temporary folder)")
    p.add_argument(
        "--moe-env",
        action="store_true",
        help="the Trainer's run sets ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES to the MoE block's class, as "
        "`accelerate launch --deepspeed_moe_layer_cls_names` does (without: the leaf_module defaults alone)",
    )
    args = p.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for name in args.models.split(","):
        if name.endswith("_trainer"):
            with tempfile.TemporaryDirectory() as tmp:
                with_trainer(name, args.stage, args.steps, args.out or tmp, args.moe_env)
        elif name == "mixtral":
            with_accelerate(name, args.stage, args.steps)
        else:
            with_initialize(name, args.stage, args.steps)


if __name__ == "__main__":
    main()
