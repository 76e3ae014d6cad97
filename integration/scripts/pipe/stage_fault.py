"""A pipeline job whose last stage fails at its second batch, for integration/test_pipeline.py: its process
dies (``--fault die``: os._exit), or it hangs, alive, in its first layer's forward (``--fault hang``); the
job's collective timeout is ``--timeout`` seconds.

Usage: stage_fault.py --stages 2 --fault die|hang [--timeout S]
"""

import argparse
import os
import time
from datetime import timedelta

import deepspeed
import torch
from deepspeed.pipe import LayerSpec, PipelineModule

HANG = False


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        if HANG:
            time.sleep(3600)
        return torch.tanh(self.fc(x))


def main():
    global HANG
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--fault", choices=["die", "hang"], default="die")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=args.timeout))
    model = PipelineModule(
        [LayerSpec(Block) for _ in range(4)],
        num_stages=args.stages,
        loss_fn=lambda o, y: (o - y).pow(2).mean(),
    )
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    }
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    x = torch.randn(2, 8)
    for step in range(3):
        if step == 1 and engine.is_last_stage():
            if args.fault == "die":
                os._exit(9)
            HANG = True
        engine.train_batch(iter([(x, x)] * 4))


if __name__ == "__main__":
    main()
