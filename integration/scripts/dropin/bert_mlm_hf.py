"""A masked-LM trainer on a Hugging Face BERT (DeepSpeedExamples' bing_bert / HF-trainer shape), offline.

A tiny ``BertForMaskedLM`` built from a config (no download), random token batches with 15% of positions
masked, ``model_engine(input_ids=..., labels=...)`` returning the HF output whose ``.loss`` is trained.
Written for ``import deepspeed``; needs ``transformers``.
Usage: bert_mlm_hf.py --deepspeed_config CFG --out LOSSES.json [--steps N]
"""

import argparse
import json

import deepspeed
import torch
from transformers import BertConfig, BertForMaskedLM


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


VOCAB, SEQ, MASK_ID = 64, 16, 3


def mlm_batch(step, rank, mbs, world):
    """This rank's slice of the step's global batch; labels are -100 except at the masked positions."""
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(5, VOCAB, (mbs * world, SEQ), generator=g)
    masked = torch.rand(mbs * world, SEQ, generator=g) < 0.15
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    ids = torch.where(masked, torch.full_like(ids, MASK_ID), ids)
    sl = slice(rank * mbs, (rank + 1) * mbs)
    return ids[sl], labels[sl]


def main():
    args = get_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertForMaskedLM(config)
    model_engine, optimizer, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters()
    )
    mbs, gas = model_engine.train_micro_batch_size_per_gpu(), model_engine.gradient_accumulation_steps()
    losses = []
    for step in range(args.steps):
        for micro in range(gas):
            ids, labels = mlm_batch(step * gas + micro, rank, mbs, world)
            outputs = model_engine(
                input_ids=ids.to(model_engine.device), labels=labels.to(model_engine.device)
            )
            model_engine.backward(outputs.loss)
            model_engine.step()
            mean = outputs.loss.detach().float().clone()
            torch.distributed.all_reduce(mean)
            losses.append(mean.item() / world)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses}, f)


if __name__ == "__main__":
    main()
