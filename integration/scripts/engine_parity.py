"""Train a small model under many configs in one job; rank 0 writes the per-step global losses as JSON.

Every rank takes its slice of the same global batch, so any world size (and a single process with a
``micro batch * world size`` micro batch) must produce the same losses. Used by test_engine_parity.py.
Usage: ds-launch --num_procs W engine_parity.py OUT.json [--only NAME] [--save DIR --save-at K [--save-for NAME]]
       ds-launch --num_procs W engine_parity.py OUT.json --load DIR --resume NAME:SAVED [--resume ...] --start K
(``--resume NAME:SAVED`` trains config NAME from the checkpoint config SAVED wrote; its losses are keyed
``NAME<-SAVED``: one launch resumes several configs, each from its own or another stage's checkpoint.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import ds_engine
import ds_zero
import torch
import torch.distributed as dist

GLOBAL_BATCH = 16
STEPS = 6
WARMUP = 2
PRECISIONS = {
    "fp32": {},
    "bf16": {"bf16": {"enabled": True}},
    "fp16": {"fp16": {"enabled": True, "initial_scale_power": 10, "loss_scale_window": 2}},
}


NVME_PATH = "@NVME_PATH@"


def configs() -> dict[str, dict]:
    out = {}
    for stage, prec, gas in itertools.product((0, 1, 2, 3), PRECISIONS, (1, 4)):
        cfg = {
            "train_batch_size": GLOBAL_BATCH,
            "gradient_accumulation_steps": gas,
            "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
            "scheduler": {
                "type": "WarmupLR",
                "params": {"warmup_num_steps": WARMUP, "warmup_max_lr": 3e-3, "warmup_type": "linear"},
            },
            "gradient_clipping": 0.5,
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 200, "allgather_bucket_size": 300},
            **PRECISIONS[prec],
        }
        if stage == 3:  # partition every parameter of this small model (the default keeps < 1e5 whole)
            cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        out[f"stage{stage}-{prec}-gas{gas}"] = cfg
    # stage 3 with DeepSpeed's persistence threshold: every parameter here stays whole
    persist = out["stage3-fp32-gas1"]
    out["stage3-fp32-gas1-persist"] = {
        **persist,
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 200},
    }
    # stage 3 with the fp32 masters, Adam state and parameter partitions in CPU memory
    offload = {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    out["stage3-fp32-gas1-offload"] = {
        **persist,
        "zero_optimization": {**persist["zero_optimization"], **offload},
    }
    # stage 3 with the parameter partitions and the optimizer state in files (ZeRO-Infinity; NVME_PATH is a
    # directory beside the output file)
    nvme = {"device": "nvme", "nvme_path": NVME_PATH}
    out["stage3-fp32-gas1-nvme"] = {
        **persist,
        "zero_optimization": {
            **persist["zero_optimization"],
            "offload_optimizer": {**nvme, "buffer_count": 2},
            "offload_param": {**nvme, "buffer_count": 3, "buffer_size": 2048, "max_in_cpu": 0},
        },
    }
    # stage 2 with the fp32 masters and Adam state in CPU memory
    out["stage2-fp32-gas1-offload"] = {
        **out["stage2-fp32-gas1"],
        "zero_optimization": {
            **out["stage2-fp32-gas1"]["zero_optimization"],
            "offload_optimizer": {"device": "cpu"},
        },
    }
    # two options that change how gradients travel, not what they are
    overlap = out["stage1-fp32-gas4"]
    out["stage1-fp32-gas4-overlap"] = {
        **overlap,
        "zero_optimization": {**overlap["zero_optimization"], "overlap_comm": True},
    }
    for stage in (0, 2):
        accum = out[f"stage{stage}-bf16-gas4"]
        out[f"stage{stage}-bf16-gas4-fp32accum"] = {
            **accum,
            "bf16": {"enabled": True, "grad_accum_dtype": "fp32"},
        }
    return out


def model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Embedding(32, 12),
        torch.nn.Flatten(),
        torch.nn.Linear(48, 24),
        torch.nn.GELU(),
        torch.nn.Linear(24, 32),
    )


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step % 2)  # two batches in turn: the loss must fall
    x = torch.randint(0, 32, (GLOBAL_BATCH, 4), generator=g)
    return x, (x.sum(1) * 7) % 32  # a learnable target


def run(cfg: dict, steps: range, save: str | None, save_at: int | None, load: str | None) -> list[float]:
    engine, *_ = ds_engine.initialize(model=model(), config=cfg)
    if load:
        engine.load_checkpoint(load)
    rank, world = dist.get_rank(), dist.get_world_size()
    gas, mbs = engine.gradient_accumulation_steps(), engine.train_micro_batch_size_per_gpu()
    losses = []
    for step in steps:
        x, y = data(step)
        total = torch.zeros(())
        for micro in range(gas):
            lo = (micro * world + rank) * mbs  # this rank's slice of the global batch
            logits = engine(x[lo : lo + mbs])
            loss = torch.nn.functional.cross_entropy(logits.float(), y[lo : lo + mbs])
            engine.backward(loss)
            engine.step()
            total += loss.detach() / gas
        dist.all_reduce(total)
        losses.append(total.item() / world)
        if save and save_at == step + 1:
            engine.save_checkpoint(save, tag=f"step{step + 1}")
    return losses, replica_divergence(engine)


def replica_divergence(engine: ds_engine.DeepSpeedEngine) -> float:
    """Largest difference between this rank's weights and rank 0's: data parallelism keeps them equal.

    At stage 3 the weights are the consolidated ones (each rank gathers them from the partitions).
    """
    gathered = getattr(engine.optimizer, "module_state_dict", None)
    params = gathered().values() if gathered is not None else engine.module.parameters()
    mine = torch.cat([p.detach().double().reshape(-1) for p in params])
    theirs = mine.clone()
    dist.broadcast(theirs, src=0)
    gap = (mine - theirs).abs().max()
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    return gap.item()


def reference(cfg: dict, steps: range) -> list[float]:
    """The same training in plain torch on one process: AdamW, linear warm-up, clipping (fp32 only)."""
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.01)
    gas = cfg["gradient_accumulation_steps"]
    mbs = GLOBAL_BATCH // gas
    losses = []
    for i, step in enumerate(steps):
        for group in opt.param_groups:  # WarmupLR (V19): lr of iteration max(0, i - 1), set from construction
            group["lr"] = 3e-3 * min(1.0, max(0, i - 1) / WARMUP)
        x, y = data(step)
        total = 0.0
        for micro in range(gas):
            loss = torch.nn.functional.cross_entropy(
                net(x[micro * mbs : (micro + 1) * mbs]), y[micro * mbs : (micro + 1) * mbs]
            )
            (loss / gas).backward()
            total += loss.item() / gas
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in net.parameters())).item()
        for p in net.parameters():  # docs/design.md §5: clip coefficient max / (norm + 1e-6)
            p.grad.mul_(min(1.0, 0.5 / (norm + 1e-6)))
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--only", action="append")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--save")
    parser.add_argument("--save-at", type=int)
    parser.add_argument("--save-for", action="append", help="save only these configs (default: every run)")
    parser.add_argument("--load", help="the --save directory of an earlier run")
    parser.add_argument("--resume", action="append", default=[], help="NAME:SAVED, with --load")
    parser.add_argument("--reference", action="store_true", help="plain torch, one process, fp32 configs")
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    steps = range(args.start, args.start + args.steps)
    nvme = os.path.join(os.path.dirname(os.path.abspath(args.out)), f"nvme-{os.path.basename(args.out)}")
    os.makedirs(nvme, exist_ok=True)
    all_configs = json.loads(json.dumps(configs()).replace(NVME_PATH, nvme))
    results = {}
    if args.reference:
        for name, cfg in all_configs.items():
            if "fp32" in name and (not args.only or name in args.only):
                results[name] = reference(cfg, steps)
        with open(args.out, "w") as f:
            json.dump({"world_size": 1, "losses": results}, f, indent=1)
        return
    # (result key, config name, checkpoint to load or None, directory to save into or None)
    jobs = []
    for spec in args.resume:
        name, saved = spec.split(":")
        jobs.append((f"{name}<-{saved}", name, f"{args.load}/{saved}", None))
    if not args.resume:
        for name in all_configs:
            if not args.only or name in args.only:
                save = args.save and (not args.save_for or name in args.save_for)
                jobs.append((name, name, None, f"{args.save}/{name}" if save else None))
    divergence = {}
    for key, name, load, save in jobs:
        results[key], divergence[key] = run(all_configs[name], steps, save, args.save_at, load)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            out = {
                "world_size": dist.get_world_size(),
                "losses": results,
                "replica_divergence": divergence,
                # collectives ZeRO sent over MPI (ds_zero/_mpi.py): nonzero only under mpirun
                "mpi_collectives": ds_zero.mpi_collective_calls(),
                # over shared memory (ds_zero/_shm.py): same-host ranks that MPI did not take
                "shm_collectives": ds_zero.shm_collective_calls(),
            }
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
