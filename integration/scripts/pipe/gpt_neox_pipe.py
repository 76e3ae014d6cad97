"""A GPT-NeoX-style pipeline-parallel trainer, written for DeepSpeed (``import deepspeed``), run unmodified.

As GPT-NeoX builds its model: a list of ``LayerSpec``s (transformer blocks, final norm) between two
``TiedLayerSpec``s sharing the word embedding (input embedding and output logits), a ``loss_fn``,
``partition_method="parameters"``, ``seed_layers=True`` (with a ``seed_fn``: DeepSpeed 0.19.8's default
seeding fails on Python 3.11, its layer indices being NumPy integers), a ``PipeDataParallelTopology``, and ``engine.train_batch(data_iter)`` over
an iterator of ``(tokens, labels)`` micro-batches. Each data-parallel rank reads its share of every step's
micro-batches (by ``engine.grid``), so the global batch, and the losses, do not depend on the layout.

Usage: gpt_neox_pipe.py --stages P --steps N --out LOSSES.json --deepspeed_config CFG [--save_dir DIR]
       [--load_dir DIR --start_step S]  (weights only: the loss of step S is the saved weights' loss)
"""

import argparse
import json
import random
import time

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

VOCAB, DIM, HEADS, SEQ, LAYERS = 64, 32, 2, 16, 4


class EmbeddingPipe(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        nn.init.normal_(self.word_embeddings.weight, std=0.02)

    def forward(self, tokens):
        return self.word_embeddings(tokens)


def logits_helper(embedding, hidden):
    """The output layer: the input embedding's weight, transposed (GPT-NeoX's _logits_helper)."""
    return F.linear(hidden, embedding.word_embeddings.weight)


class TransformerLayerPipe(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class NormPipe(nn.LayerNorm):
    pass


def cross_entropy(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))


def seed_everything(seed):
    seed = int(seed)  # DeepSpeed's layer indices are NumPy integers, which Python 3.11's random.seed refuses
    random.seed(seed)
    torch.manual_seed(seed)


def model_specs():
    return [
        TiedLayerSpec("embed", EmbeddingPipe, VOCAB, DIM, tied_weight_attr="word_embeddings.weight"),
        *[LayerSpec(TransformerLayerPipe, DIM, HEADS) for _ in range(LAYERS)],
        LayerSpec(NormPipe, DIM),
        TiedLayerSpec(
            "embed",
            EmbeddingPipe,
            VOCAB,
            DIM,
            forward_fn=logits_helper,
            tied_weight_attr="word_embeddings.weight",
        ),
    ]


def micro_batches(step, micro, per_step, dp_rank, dp_size):
    """This data-parallel rank's micro-batches of ``step``: sequences where each token follows from the last."""
    share = per_step // dp_size
    out = []
    for i in range(step * per_step + dp_rank * share, step * per_step + (dp_rank + 1) * share):
        g = torch.Generator().manual_seed(1000 + i)
        start = torch.randint(0, VOCAB, (micro, 1), generator=g)
        mult = torch.randint(1, 4, (micro, 1), generator=g)
        seq = (start + mult * torch.arange(SEQ + 1)) % VOCAB
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def main():
    parser = argparse.ArgumentParser(description="GPT-NeoX-style pipeline training")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", required=True)
    parser.add_argument("--save_dir", default=None)
    parser.add_argument("--load_dir", default=None, help="start from this checkpoint's weights")
    parser.add_argument("--start_step", type=int, default=0, help="the data step to start at")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    world = torch.distributed.get_world_size()
    topology = PipeDataParallelTopology(num_pp=args.stages, num_dp=world // args.stages)
    model = PipelineModule(
        layers=model_specs(),
        loss_fn=cross_entropy,
        topology=topology,
        partition_method="parameters",
        seed_layers=True,
        seed_fn=seed_everything,
        base_seed=1234,
        activation_checkpoint_interval=0,
    )
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=[p for p in model.parameters() if p.requires_grad]
    )
    micro = engine.train_micro_batch_size_per_gpu()
    per_step = engine.train_batch_size() // micro
    dp_rank, dp_size = engine.grid.get_data_parallel_rank(), engine.grid.get_data_parallel_world_size()
    if args.load_dir:
        engine.load_checkpoint(args.load_dir, load_optimizer_states=False, load_lr_scheduler_states=False)
    losses, step_times = [], []
    for step in range(args.start_step, args.steps):
        data_iter = iter(micro_batches(step, micro, per_step, dp_rank, dp_size))
        start = time.perf_counter()
        loss = engine.train_batch(data_iter=data_iter)
        step_times.append(time.perf_counter() - start)
        losses.append(float(loss))
    if args.save_dir:
        engine.save_checkpoint(args.save_dir)
    if torch.distributed.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "losses": losses,
                    "step_times": step_times,
                    "parts": [int(p) for p in model.parts],
                    "stages": args.stages,
                    "world": world,
                },
                f,
            )


if __name__ == "__main__":
    main()
