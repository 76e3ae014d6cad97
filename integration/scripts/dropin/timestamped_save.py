"""Saves a checkpoint into a folder named by a timestamp taken on each rank (a common script pattern).

The ranks' timestamps differ, so they pass different ``save_dir``s to ``save_checkpoint``.
Written for ``import deepspeed``. Usage: timestamped_save.py --deepspeed_config CFG --root DIR
"""

import argparse
import os
import time
from datetime import datetime

import deepspeed
import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--root", required=True)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    for _ in range(2):
        engine.backward(engine(torch.randn(engine.train_micro_batch_size_per_gpu(), 4)).pow(2).mean())
        engine.step()
    time.sleep(0.01 * torch.distributed.get_rank())  # ranks reach this line at different moments
    save_dir = os.path.join(args.root, datetime.now().strftime("run-%Y%m%d-%H%M%S-%f"))
    engine.save_checkpoint(save_dir)


if __name__ == "__main__":
    main()
