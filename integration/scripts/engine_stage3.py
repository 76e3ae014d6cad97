"""Stage 3 through the engine: a zero.Init model, a checkpoint, its fp32 export and the 16-bit weights.

Rank 0 writes JSON: the losses of a model built inside ``ds_engine.zero.Init`` and of the same model
built normally, what the ranks held, and the largest difference between the exported fp32 weights
(``python -m ds_checkpoint export``'s function) and the weights gathered from the fp32 masters.
Usage: ds-launch --num_procs W engine_stage3.py OUT.json SAVE_DIR
"""

from __future__ import annotations

import argparse
import json

import ds_engine
import torch
import torch.distributed as dist
from ds_checkpoint import export_fp32
from engine_parity import configs, data, model
from safetensors.torch import load_file

CFG = {**configs()["stage3-bf16-gas1"], "zero_optimization": {
    "stage": 3, "reduce_bucket_size": 200, "stage3_param_persistence_threshold": 0,
    "stage3_gather_16bit_weights_on_model_save": True}}  # fmt: skip


def train(engine: ds_engine.DeepSpeedEngine, steps: int) -> list[float]:
    rank, world, mbs = dist.get_rank(), dist.get_world_size(), engine.train_micro_batch_size_per_gpu()
    losses = []
    for step in range(steps):
        x, y = data(step)
        loss = torch.nn.functional.cross_entropy(engine(x[rank * mbs : (rank + 1) * mbs]).float(),
                                                 y[rank * mbs : (rank + 1) * mbs])  # fmt: skip
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("save")
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    out, save = args.out, args.save
    ds_engine.init_distributed()
    with ds_engine.zero.Init(config_dict_or_path=CFG):
        built_cut = model()
    held = sum(p.numel() for p in built_cut.parameters())
    cut_engine, *_ = ds_engine.initialize(model=built_cut, config=CFG)
    cut_losses = train(cut_engine, 4)
    normal_engine, *_ = ds_engine.initialize(model=model(), config=CFG)
    normal_losses = train(normal_engine, 4)
    cut_engine.save_checkpoint(save, tag="t4")
    fp32 = cut_engine.optimizer.fp32_state_dict()
    sixteen = cut_engine.optimizer.gathered_16bit_state_dict()
    result = {"held_after_init": held, "cut": cut_losses, "normal": normal_losses}
    if dist.get_rank() == 0:
        export_fp32(save, f"{save}/fp32.safetensors", tag="t4")
        exported = load_file(f"{save}/fp32.safetensors")
        result["export_error"] = max((exported[k] - v).abs().max().item() for k, v in fp32.items())
        result["export_names"] = sorted(exported)
        result["sixteen_bit"] = {k: str(v.dtype) for k, v in sixteen.items()}
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    else:
        assert sixteen is None


if __name__ == "__main__":
    main()
