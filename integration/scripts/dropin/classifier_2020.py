"""An image classifier trainer in DeepSpeed's 2020 style (the CIFAR-10 tutorial's shape), offline.

``--local_rank`` and ``add_config_arguments``, ``initialize(args=..., training_data=...)`` building the loader,
``model_engine.local_rank`` as the device, ``.half()`` inputs when fp16. Written for ``import deepspeed``;
the tests run it with only that line changed. Usage: classifier_2020.py --deepspeed_config CFG --out LOSSES.json
"""

import argparse
import json

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


def add_argument():
    parser = argparse.ArgumentParser(description="tiny-image classifier")
    parser.add_argument(
        "--local_rank", type=int, default=-1, help="local rank passed from distributed launcher"
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(6 * 3 * 3, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))  # (B, 6, 3, 3)
        x = x.view(-1, 6 * 3 * 3)
        return self.fc2(F.relu(self.fc1(x)))


def synthetic_images(n=256):
    """CIFAR-like data without a download: 8x8 RGB images whose class is a colour pattern."""
    g = torch.Generator().manual_seed(1234)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.randn(n, 3, 8, 8, generator=g) * 0.5
    images[:, labels % 3] += (labels.float() / 10).view(-1, 1, 1)
    return torch.utils.data.TensorDataset(images, labels)


args = add_argument()
torch.manual_seed(0)
net = Net()
parameters = filter(lambda p: p.requires_grad, net.parameters())
trainset = synthetic_images()
model_engine, optimizer, trainloader, _ = deepspeed.initialize(
    args=args, model=net, model_parameters=parameters, training_data=trainset
)
criterion = nn.CrossEntropyLoss()
world = torch.distributed.get_world_size()
losses = []  # each micro-step's loss, averaged over the ranks
for _epoch in range(args.epochs):
    for _i, data in enumerate(trainloader):
        # the tutorial moves to model_engine.local_rank (a CUDA index); on CPU the engine's device is the same idea
        inputs, labels = data[0].to(model_engine.device), data[1].to(model_engine.device)
        if model_engine.fp16_enabled():
            inputs = inputs.half()
        elif model_engine.bfloat16_enabled():
            inputs = inputs.bfloat16()
        outputs = model_engine(inputs)
        loss = criterion(outputs.float(), labels)
        model_engine.backward(loss)
        model_engine.step()
        mean = loss.detach().float().clone()
        torch.distributed.all_reduce(mean)
        losses.append(mean.item() / world)
if torch.distributed.get_rank() == 0:
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "global_steps": model_engine.global_steps}, f)
