"""A training script written for DeepSpeed. The tests run it unchanged with the real ``deepspeed`` package
and with ds's (packages/deepspeed); then compare the losses.

Usage (any launcher): script.py --deepspeed_config CFG.json --out LOSSES.json [--steps N]
"""

import argparse
import json

import deepspeed
import torch
import torch.nn.functional as F


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 64)
        self.fc2 = torch.nn.Linear(64, 64)
        self.out = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(42)
    model = Net()
    engine, optimizer, _, lr_scheduler = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters()
    )

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    gas, mbs = engine.gradient_accumulation_steps(), engine.train_micro_batch_size_per_gpu()
    g = torch.Generator().manual_seed(0)
    data_x = torch.randn(4, engine.train_batch_size(), 16, generator=g)
    data_y = torch.randn(4, engine.train_batch_size(), 4, generator=g)
    losses = []
    for step in range(args.steps):
        x, y = data_x[step % 4], data_y[step % 4]
        total = torch.zeros(())
        for micro in range(gas):
            lo = (micro * world + rank) * mbs
            loss = F.mse_loss(engine(x[lo : lo + mbs].to(engine.device)), y[lo : lo + mbs].to(engine.device))
            engine.backward(loss)
            engine.step()
            total += loss.detach().float().cpu() / gas
        torch.distributed.all_reduce(total)
        losses.append(total.item() / world)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "lr": lr_scheduler.get_last_lr() if lr_scheduler else None}, f)


if __name__ == "__main__":
    main()
