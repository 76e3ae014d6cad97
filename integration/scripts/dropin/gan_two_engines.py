"""A GAN trainer with two engines in one process (DeepSpeedExamples' gan_deepspeed_train.py shape), offline.

The discriminator's engine steps on real and fake batches; the generator's loss is built through the
discriminator, so its backward also writes gradients into the discriminator, which the script clears with
``netD.zero_grad()`` on the raw module at the start of each iteration. Written for ``import deepspeed``.
Usage: gan_two_engines.py --deepspeed_config CFG --out LOSSES.json [--steps N]
"""

import argparse
import json

import deepspeed
import torch
import torch.nn as nn


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class Generator(nn.Module):
    def __init__(self, nz=8):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(nz, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, z):
        return self.main(z)  # (B, 2)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1)  # (B,)


def real_batch(step, rank, mbs, world):
    """This rank's slice of the step's global batch: points on a ring of radius 2."""
    g = torch.Generator().manual_seed(1000 + step)
    angle = torch.rand(mbs * world, generator=g) * 6.2832
    points = torch.stack([2 * torch.cos(angle), 2 * torch.sin(angle)], dim=1)
    return points[rank * mbs : (rank + 1) * mbs]


def main():
    args = get_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(0)
    netG, netD = Generator(), Discriminator()
    model_engineG, optimizerG, _, _ = deepspeed.initialize(
        args=args, model=netG, model_parameters=netG.parameters()
    )
    model_engineD, optimizerD, _, _ = deepspeed.initialize(
        args=args, model=netD, model_parameters=netD.parameters()
    )
    criterion = nn.BCELoss()
    mbs = model_engineD.train_micro_batch_size_per_gpu()
    d_losses, g_losses = [], []
    for step in range(args.steps):
        # (1) update D: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real = real_batch(step, rank, mbs, world).to(model_engineD.device)
        label = torch.full((mbs,), 1.0, device=model_engineD.device)
        errD_real = criterion(model_engineD(real), label)
        model_engineD.backward(errD_real)
        g = torch.Generator().manual_seed(5000 + step * world + rank)
        noise = torch.randn(mbs, 8, generator=g).to(model_engineG.device)
        fake = model_engineG(noise)
        label.fill_(0.0)
        errD_fake = criterion(model_engineD(fake.detach()), label)
        model_engineD.backward(errD_fake)
        model_engineD.step()
        # (2) update G: maximize log(D(G(z))) through the raw discriminator (DeepSpeed 0.19 refuses a
        # generator backward through D's engine); this backward also writes into D's parameters
        netG.zero_grad()
        label.fill_(1.0)
        errG = criterion(netD(fake), label)
        model_engineG.backward(errG)
        model_engineG.step()
        both = torch.stack([(errD_real + errD_fake).detach(), errG.detach()]).float()
        torch.distributed.all_reduce(both)
        d_losses.append(both[0].item() / world)
        g_losses.append(both[1].item() / world)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": g_losses, "d_losses": d_losses}, f)


if __name__ == "__main__":
    main()
