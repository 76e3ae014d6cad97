"""A DeepSpeed-MoE training script in DeepSpeed's documented style (the CIFAR example's ``--moe``): an MoE
layer between two dense ones, the optimizer's groups split with
``split_params_into_different_moe_groups_for_optimizer``, the gate's auxiliary loss added to the loss.
Run unchanged by DeepSpeed 0.19.8's ``deepspeed`` launcher (the fixtures, tools/fixtures/make_moe_fixtures.py)
and by ds's. One launch trains every case of ``--ep`` x ``--k`` x ``--drop`` (a fresh model and engine each);
rank 0 prints one JSON line per step with the case, every rank's loss and l_aux, and the global gradient
norm. ``--cases`` names the cases instead, each as ``ep<N>-k<N>-drop|nodrop`` followed by any of ``-z<stage>``,
``-bf16``, ``-sgd`` (SGD with momentum instead of AdamW) and ``-clip<max norm>``. Usage:
  DS_ACCELERATOR=cpu deepspeed --num_gpus 2 moe_train.py --ep 1,2 --k 1,2 --drop yes,no [--stage 0] [--dtype fp32]
  DS_ACCELERATOR=cpu deepspeed --num_gpus 2 moe_train.py --cases ep2-k1-drop-z2-bf16,ep2-k2-nodrop-z1-sgd-clip0.5
"""

from __future__ import annotations

import argparse
import json
import time

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.moe.layer import MoE
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

WIDTH, EXPERTS, TOKENS = 16, 4, 24


class Net(torch.nn.Module):
    def __init__(self, ep: int, k: int, drop: bool) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(WIDTH, WIDTH)
        expert = torch.nn.Sequential(torch.nn.Linear(WIDTH, 32), torch.nn.ReLU(), torch.nn.Linear(32, WIDTH))
        self.moe = MoE(WIDTH, expert, num_experts=EXPERTS, ep_size=ep, k=k, min_capacity=0, drop_tokens=drop)
        self.head = torch.nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.inp(x))
        out, l_aux, _ = self.moe(h)
        return self.head(h + out), l_aux


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--ep", default="1", help="expert-parallel sizes, comma-separated")
    p.add_argument("--k", default="1", help="top-k values (1, 2), comma-separated")
    p.add_argument("--drop", default="yes", help="drop_tokens values (yes, no), comma-separated")
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--clip", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument(
        "--cases", default="", help="named cases (see above) instead of the --ep x --k x --drop product"
    )
    args = p.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    if args.cases:
        for case in args.cases.split(","):
            train(case, **parse_case(case, args))
        return
    for ep in map(int, args.ep.split(",")):
        for k in map(int, args.k.split(",")):
            for drop in args.drop.split(","):
                case = f"ep{ep}-k{k}-{'drop' if drop == 'yes' else 'nodrop'}"
                train(case, ep, k, drop == "yes", args.stage, args.dtype, "adamw", args.clip, args.steps)


def parse_case(case: str, args: argparse.Namespace) -> dict:
    """``ep2-k1-drop-z2-bf16-sgd-clip0.5`` -> train()'s arguments (unnamed ones from the command line)."""
    out = {"stage": args.stage, "dtype": args.dtype, "optim": "adamw", "clip": args.clip, "steps": args.steps}
    for part in case.split("-"):
        if part in ("drop", "nodrop"):
            out["drop"] = part == "drop"
        elif part in ("fp32", "bf16"):
            out["dtype"] = part
        elif part in ("adamw", "sgd"):
            out["optim"] = part
        elif part.startswith("clip"):
            out["clip"] = float(part[4:])
        elif part.startswith("ep"):
            out["ep"] = int(part[2:])
        elif part.startswith("k"):
            out["k"] = int(part[1:])
        elif part.startswith("z"):
            out["stage"] = int(part[1:])
        else:
            raise SystemExit(f"case {case!r}: unknown part {part!r}")
    return out


def train(
    case: str, ep: int, k: int, drop: bool, stage: int, dtype: str, optim: str, clip: float, steps: int
) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Net(ep, k, drop)
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "parameters"}
    )
    if optim == "sgd":  # its update follows the gradient's size: the norm and the clipping show in the losses
        optimizer = torch.optim.SGD(groups, lr=0.05, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(groups, lr=1e-2)
    config = {
        "train_micro_batch_size_per_gpu": TOKENS,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": clip,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,  # SGD at ZeRO
        "bf16": {"enabled": dtype == "bf16"},
        "steps_per_print": 1000,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    x_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    torch.manual_seed(100 + rank)  # the gates' random draws (RTS, 2nd-expert sampling): one stream per rank
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(TOKENS, WIDTH, generator=g)
        y = x[:, :4].sum(dim=1, keepdim=True)
        t0 = time.perf_counter()
        out, l_aux = engine(x.to(x_dtype))
        loss = torch.nn.functional.mse_loss(out.float(), y) + 0.01 * l_aux
        engine.backward(loss)
        engine.step()
        seconds = time.perf_counter() - t0
        norm = engine.get_global_grad_norm()
        both = torch.tensor([loss.item(), l_aux.item()])
        every = [torch.zeros(2) for _ in range(world)]
        dist.all_gather(every, both)
        if rank == 0:
            record = {
                "case": case,
                "step": step,
                "loss": [t[0].item() for t in every],
                "l_aux": [t[1].item() for t in every],
                "grad_norm": None if norm is None else float(norm),  # None: DeepSpeed computed none
                "seconds": seconds,  # rank 0's forward, backward and step
            }
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
