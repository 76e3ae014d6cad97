"""An image classifier trainer in DeepSpeed's current style (DeepSpeedExamples' cifar10_deepspeed.py shape).

``get_accelerator()`` for the device, ``deepspeed.init_distributed()``, the config built in the script as a
dict (with DeepSpeed's defaults spelled out, as current examples do), ``bfloat16_enabled()`` /
``fp16_enabled()`` to cast inputs, ``deepspeed.comm`` for the loss average, ``log_dist`` for output, and the
example's mixture-of-experts arguments (``--moe`` swaps the last layer for ``deepspeed.moe.layer.MoE``).
Written for ``import deepspeed``; the tests run it unmodified.
Usage: classifier_current.py --stage {0,1,2} --dtype {fp32,bf16,fp16} --out LOSSES.json [--save_dir DIR] [--moe ...]
"""

import argparse
import json

import deepspeed
import deepspeed.comm as dist
import torch
import torch.nn as nn
from deepspeed.accelerator import get_accelerator
from deepspeed.utils import log_dist


def get_args():
    parser = argparse.ArgumentParser(description="tiny-image classifier (current DeepSpeed style)")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stage", type=int, default=0)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--save_dir", default=None)
    # mixture of experts, as the example's
    parser.add_argument("--moe", default=False, action="store_true", help="use deepspeed mixture of experts")
    parser.add_argument("--ep-world-size", default=1, type=int, help="(moe) expert parallel world size")
    parser.add_argument("--num-experts", type=int, nargs="+", default=[1], help="number of experts list")
    parser.add_argument("--mlp-type", type=str, default="standard", help="standard or residual MoE")
    parser.add_argument("--top-k", default=1, type=int, help="(moe) gating top 1 and 2 supported")
    parser.add_argument("--min-capacity", default=0, type=int, help="(moe) minimum capacity of an expert")
    parser.add_argument("--noisy-gate-policy", default=None, type=str, help="(moe) noisy gating")
    parser.add_argument(
        "--moe-param-group", default=False, action="store_true", help="(moe) own param groups"
    )
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def ds_config(args):
    return {
        "train_batch_size": 32,
        "steps_per_print": 2000,
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "Adam",
            "params": {"lr": 0.003, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.003, "warmup_num_steps": 4},
        },
        "bf16": {"enabled": args.dtype == "bf16"},
        "fp16": {
            "enabled": args.dtype == "fp16",
            "fp16_master_weights_and_grads": False,
            "loss_scale": 0,
            "loss_scale_window": 500,
            "hysteresis": 2,
            "min_loss_scale": 1,
            "initial_scale_power": 15,
        },
        "wall_clock_breakdown": False,
        "zero_optimization": {
            "stage": args.stage,
            "allgather_partitions": True,
            "reduce_scatter": True,
            "allgather_bucket_size": 50000000,
            "reduce_bucket_size": 50000000,
            "overlap_comm": False,
            "contiguous_gradients": True,
        },
        "flops_profiler": {"enabled": False},
        "wandb": {"enabled": False},
    }


class Net(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 4 * 4, 32), nn.ReLU())
        self.moe = args.moe
        if args.moe:
            experts = []
            for n_e in args.num_experts:
                experts.append(
                    deepspeed.moe.layer.MoE(
                        hidden_size=32,
                        expert=nn.Linear(32, 32),
                        num_experts=n_e,
                        ep_size=args.ep_world_size,
                        use_residual=args.mlp_type == "residual",
                        k=args.top_k,
                        min_capacity=args.min_capacity,
                        noisy_gate_policy=args.noisy_gate_policy,
                    )
                )
            self.experts = nn.ModuleList(experts)
        self.out = nn.Linear(32, 10)

    def forward(self, x):
        x = self.head(self.features(x))  # (B, 32)
        if self.moe:
            for layer in self.experts:
                x, _, _ = layer(x)
        return self.out(x)  # (B, 10)


def create_moe_param_groups(model):
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    parameters = {"params": [p for p in model.parameters()], "name": "parameters"}
    return split_params_into_different_moe_groups_for_optimizer(parameters)


def synthetic_images(n=256):
    """CIFAR-like data without a download: 8x8 RGB images whose class is a colour pattern."""
    g = torch.Generator().manual_seed(1234)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.randn(n, 3, 8, 8, generator=g) * 0.5
    images[:, labels % 3] += (labels.float() / 10).view(-1, 1, 1)
    return torch.utils.data.TensorDataset(images, labels)


def main():
    args = get_args()
    deepspeed.init_distributed(dist_backend="gloo")  # CPU run: DeepSpeed's CPU default is oneCCL
    if args.moe:
        deepspeed.utils.groups.initialize(ep_size=args.ep_world_size)
    torch.manual_seed(0)
    net = Net(args)
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    if args.moe_param_group:
        parameters = create_moe_param_groups(net)
    model_engine, optimizer, trainloader, __ = deepspeed.initialize(
        args=args,
        model=net,
        model_parameters=parameters,
        training_data=synthetic_images(),
        config=ds_config(args),
    )
    local_device = get_accelerator().device_name(model_engine.local_rank)
    local_rank = model_engine.local_rank
    target_dtype = None
    if model_engine.bfloat16_enabled():
        target_dtype = torch.bfloat16
    elif model_engine.fp16_enabled():
        target_dtype = torch.half
    criterion = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(args.epochs):
        for _i, data in enumerate(trainloader):
            inputs, labels = data[0].to(local_device), data[1].to(local_device)
            if target_dtype is not None:
                inputs = inputs.to(target_dtype)
            outputs = model_engine(inputs)
            loss = criterion(outputs.float(), labels)
            model_engine.backward(loss)
            model_engine.step()
            mean = loss.detach().float().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.SUM)
            losses.append(mean.item() / dist.get_world_size())
        log_dist(f"epoch {epoch} loss {losses[-1]:.4f} lr {model_engine.get_lr()}", ranks=[0])
    if args.save_dir:
        model_engine.save_checkpoint(args.save_dir, client_state={"epoch": args.epochs})
    if local_rank <= 0 and dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "global_steps": model_engine.global_steps}, f)


if __name__ == "__main__":
    main()
