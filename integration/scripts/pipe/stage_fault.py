"""A pipeline job whose last stage's process dies at its second batch (os._exit), for integration/test_pipeline.py.

Usage: stage_dies.py --stages 2
"""

import argparse
import os

import deepspeed
import torch
from deepspeed.pipe import LayerSpec, PipelineModule


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--stages", type=int, default=2)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
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
            os._exit(9)
        engine.train_batch(iter([(x, x)] * 4))


if __name__ == "__main__":
    main()
