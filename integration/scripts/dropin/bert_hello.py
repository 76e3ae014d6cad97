"""A masked-LM trainer in the shape of DeepSpeed's HelloDeepSpeed BERT example (train_bert_ds.py), offline.

A small transformer encoder with a tied LM head trained on synthetic token batches (15% masked), the config
built in the script, ``log_dist`` for the loss, ``save_checkpoint(..., client_state={"checkpoint_step": step})``
every few steps, then a fresh model and engine that ``load_checkpoint`` the saved step, read the step back
from the client state and train on from there. Written for ``import deepspeed``.
Usage: bert_hello.py --out LOSSES.json --checkpoint_dir DIR [--steps N] [--stage S] [--dtype fp32|bf16]
"""

import argparse
import json
import logging

import deepspeed
import torch
import torch.nn as nn
from deepspeed.utils import log_dist

VOCAB, SEQ, MASK_ID, PAD_ID = 96, 16, 3, 0


def get_args():
    parser = argparse.ArgumentParser(description="tiny masked LM (HelloDeepSpeed style)")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--checkpoint_every", type=int, default=4)
    parser.add_argument("--stage", type=int, default=1)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--checkpoint_dir", required=True)
    parser.add_argument("--out", required=True)
    return parser.parse_args()


class MaskedLM(nn.Module):
    """Token + position embeddings, a 2-layer encoder, an LM head tied to the token embedding."""

    def __init__(self, hidden=32, heads=2, layers=2):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, hidden)
        self.positions = nn.Embedding(SEQ, hidden)
        layer = nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, input_ids, labels):
        h = self.tokens(input_ids) + self.positions.weight[: input_ids.shape[1]]  # (B, T, H)
        logits = self.norm(self.encoder(h)) @ self.tokens.weight.t()  # (B, T, V)
        return nn.functional.cross_entropy(
            logits.float().reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100
        )


def masked_batch(step, rank, micro_batch, world):
    """This rank's slice of the step's global batch; labels are -100 except at the masked positions."""
    g = torch.Generator().manual_seed(7000 + step)
    ids = torch.randint(5, VOCAB, (micro_batch * world, SEQ), generator=g)
    masked = torch.rand(micro_batch * world, SEQ, generator=g) < 0.15
    masked[:, 0] = True  # every row has a target
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    ids = torch.where(masked, torch.full_like(ids, MASK_ID), ids)
    rows = slice(rank * micro_batch, (rank + 1) * micro_batch)
    return ids[rows], labels[rows]


def ds_config(args):
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "optimizer": {"type": "Adam", "params": {"lr": 3e-3}},
        "bf16": {"enabled": args.dtype == "bf16"},
        "zero_optimization": {"stage": args.stage},
    }


def build(args):
    torch.manual_seed(0)
    model = MaskedLM()
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config(args)
    )
    return engine


def train(engine, first_step, last_step, args, losses):
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    micro_batch = engine.train_micro_batch_size_per_gpu()
    for step in range(first_step, last_step):
        ids, labels = masked_batch(step, rank, micro_batch, world)
        loss = engine(ids.to(engine.device), labels.to(engine.device))
        engine.backward(loss)
        engine.step()
        mean = loss.detach().float().clone()
        torch.distributed.all_reduce(mean)
        losses.append(mean.item() / world)
        log_dist(f"step {step} loss {losses[-1]:.4f}", ranks=[0], level=logging.INFO)
        if (step + 1) % args.checkpoint_every == 0:
            engine.save_checkpoint(save_dir=args.checkpoint_dir, client_state={"checkpoint_step": step})


def main():
    args = get_args()
    deepspeed.init_distributed(dist_backend="gloo")  # CPU run
    losses = []
    train(build(args), 0, args.steps, args, losses)
    # resume: a fresh model and engine from the first checkpoint, trained on to the end
    engine = build(args)
    tag = f"global_step{args.checkpoint_every}"
    _, client_state = engine.load_checkpoint(load_dir=args.checkpoint_dir, tag=tag)
    resumed = []
    train(engine, client_state["checkpoint_step"] + 1, args.steps, args, resumed)
    if torch.distributed.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "resumed_losses": resumed, "client_state": client_state}, f)


if __name__ == "__main__":
    main()
