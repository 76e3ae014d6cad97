"""A GPT-NeoX-style pipeline-parallel trainer, written for DeepSpeed (``import deepspeed``), run unmodified.

As GPT-NeoX builds its model: a list of ``LayerSpec``s (transformer blocks, final norm) between two
``TiedLayerSpec``s sharing the word embedding (input embedding and output logits), a ``loss_fn``,
``partition_method="parameters"``, ``seed_layers=True`` (with a ``seed_fn``: DeepSpeed 0.19.8's default
seeding fails on Python 3.11, its layer indices being NumPy integers), a ``PipeDataParallelTopology``, and ``engine.train_batch(data_iter)`` over
an iterator of ``(tokens, labels)`` micro-batches. Each data-parallel rank reads its share of every step's
micro-batches (by ``engine.grid``), so the global batch, and the losses, do not depend on the layout.

Usage: gpt_neox_pipe.py --stages P --steps N --out LOSSES.json --deepspeed_config CFG [--save_dir DIR]
       [--load_dir DIR --start_step S]  (weights only: the loss of step S is the saved weights' loss)
       [--tiny]  (a model of a few hundred weights: fp16 arithmetic on a CPU is very slow)
       gpt_neox_pipe.py --stages P --out RESULTS.json --runs RUNS.json  (several configs, one job)
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
FULL = {"VOCAB": VOCAB, "DIM": DIM, "HEADS": HEADS, "SEQ": SEQ, "LAYERS": LAYERS}
TINY = {"VOCAB": 16, "DIM": 8, "HEADS": 2, "SEQ": 4, "LAYERS": 2}


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


def train(args, stages, steps, config=None, tiny=False, start_step=0, load_dir=None, save_dir=None):
    """Build the pipeline, train ``steps`` steps (from ``start_step``) and return what rank 0 writes."""
    globals().update(TINY if tiny else FULL)
    world = torch.distributed.get_world_size()
    topology = PipeDataParallelTopology(num_pp=stages, num_dp=world // stages)
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
    params = [p for p in model.parameters() if p.requires_grad]
    if config is None:  # the command line's --deepspeed_config
        engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=params)
    else:
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    micro = engine.train_micro_batch_size_per_gpu()
    per_step = engine.train_batch_size() // micro
    dp_rank, dp_size = engine.grid.get_data_parallel_rank(), engine.grid.get_data_parallel_world_size()
    if load_dir:
        engine.load_checkpoint(load_dir, load_optimizer_states=False, load_lr_scheduler_states=False)
    losses, step_times, skipped, scales = [], [], [], []
    for step in range(start_step, steps):
        data_iter = iter(micro_batches(step, micro, per_step, dp_rank, dp_size))
        start = time.perf_counter()
        loss = engine.train_batch(data_iter=data_iter)
        step_times.append(time.perf_counter() - start)
        losses.append(float(loss))
        skipped.append(engine.skipped_steps)  # fp16: the steps an overflow skipped, so far
        scales.append(float(engine.optimizer.loss_scale) if engine.fp16_enabled() else None)  # and the scale
    if save_dir:
        engine.save_checkpoint(save_dir)
    return {
        "losses": losses,
        "skipped_steps": skipped,
        "loss_scales": scales,
        "step_times": step_times,
        "parts": [int(p) for p in model.parts],
        "stages": stages,
        "world": world,
    }


def main():
    parser = argparse.ArgumentParser(description="GPT-NeoX-style pipeline training")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", required=True)
    parser.add_argument("--save_dir", default=None)
    parser.add_argument("--load_dir", default=None, help="start from this checkpoint's weights")
    parser.add_argument("--start_step", type=int, default=0, help="the data step to start at")
    parser.add_argument("--tiny", action="store_true", help="the tiny model (for fp16 on a CPU)")
    parser.add_argument(
        "--runs",
        default=None,
        help='a JSON file {name: {"config": {...}, "steps": N, "tiny": bool}}: each run in turn, in this one '
        "job; --out then holds {name: result}",
    )
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    if args.runs:
        with open(args.runs) as f:
            runs = json.load(f)
        result = {
            name: train(args, args.stages, run["steps"], config=run["config"], tiny=run.get("tiny", False))
            for name, run in runs.items()
        }
    else:
        result = train(
            args,
            args.stages,
            args.steps,
            tiny=args.tiny,
            start_step=args.start_step,
            load_dir=args.load_dir,
            save_dir=args.save_dir,
        )
    if torch.distributed.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
