"""A DeepSpeed-Ulysses training script in DeepSpeed's style (Megatron-DeepSpeed's layout, batch first).

Every rank of a sequence-parallel group takes its slice of each sequence; ``DistributedAttention`` exchanges the
heads for the whole sequence around the local attention; the engine reduces the gradients over data x sequence.
It runs unchanged with the real DeepSpeed 0.19.8 (tools/fixtures/make_deepspeed_ulysses_fixtures.py records its
losses) and with ds's ``deepspeed`` package (integration/test_ulysses_parity.py compares them).

Usage (any launcher): ulysses_train.py --deepspeed_config CFG.json --out LOSSES.json [--steps N] [--checkpoint]
The config carries ``sequence_parallel_size``.
"""

import argparse
import json
import time

import deepspeed
import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
import torch
import torch.distributed as dist
import torch.nn.functional as F
from deepspeed.sequence.layer import DistributedAttention

VOCAB, DIM, HEADS, LAYERS = 64, 32, 4, 2
SEQ = 32  # --seq changes it (tools/bench/bench_ulysses.py)


def causal_attention(q, k, v):
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return out.transpose(1, 2)


class Block(torch.nn.Module):
    def __init__(self, group):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(DIM, 2 * DIM), torch.nn.GELU(), torch.nn.Linear(2 * DIM, DIM)
        )
        self.attn = DistributedAttention(causal_attention, group, scatter_idx=2, gather_idx=1)

    def forward(self, x):
        q, k, v = self.qkv(self.norm1(x)).unflatten(-1, (3, HEADS, -1)).unbind(2)
        x = x + self.proj(self.attn(q, k, v, batch_dim_idx=0).flatten(2))
        return x + self.mlp(self.norm2(x))


class UlyssesLM(torch.nn.Module):
    def __init__(self, group, checkpoint):
        super().__init__()
        self.group, self.checkpoint = group, checkpoint
        self.emb, self.pos = torch.nn.Embedding(VOCAB, DIM), torch.nn.Embedding(SEQ, DIM)
        self.blocks = torch.nn.ModuleList(Block(group) for _ in range(LAYERS))
        self.norm, self.head = torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens, labels):
        start = dist.get_rank(self.group) * tokens.shape[1]
        x = self.emb(tokens) + self.pos(torch.arange(start, start + tokens.shape[1]))
        for block in self.blocks:
            x = deepspeed.checkpointing.checkpoint(block, x) if self.checkpoint else block(x)
        return F.cross_entropy(self.head(self.norm(x)).flatten(0, 1), labels.flatten())


def main():
    global SEQ
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--checkpoint", action="store_true", help="activation checkpointing of every block")
    parser.add_argument("--seq", type=int, default=SEQ, help="sequence length (the benchmark's)")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    SEQ = args.seq  # the module's: the model's position table and the data below read it

    deepspeed.init_distributed(dist_backend="gloo")
    with open(args.deepspeed_config) as f:
        sp = json.load(f)["sequence_parallel_size"]
    mpu.initialize_sequence_parallel(sp)
    group = mpu.get_sequence_parallel_group()
    torch.manual_seed(42)
    model = UlyssesLM(group, args.checkpoint)
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), mpu=mpu
    )

    rank, world = dist.get_rank(), dist.get_world_size()
    sp_rank, dp_rank, dp = rank % sp, rank // sp, world // sp
    # DeepSpeed derives these from world / sp as floats: int() them
    mbs, gas = int(engine.train_micro_batch_size_per_gpu()), int(engine.gradient_accumulation_steps())
    assert int(engine.train_batch_size()) == mbs * gas * dp
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, VOCAB, (4, mbs * gas * dp, SEQ + 1), generator=g)
    chunk = SEQ // sp
    losses, seconds = [], []
    for step in range(args.steps):
        start = time.perf_counter()
        total = torch.zeros(())
        for micro in range(gas):
            first = (micro * dp + dp_rank) * mbs  # this data-parallel rank's micro-batch
            batch = data[step % 4, first : first + mbs]
            tokens, labels = batch[:, :-1], batch[:, 1:]
            mine = slice(sp_rank * chunk, (sp_rank + 1) * chunk)  # this sequence-parallel rank's slice
            loss = engine(tokens[:, mine], labels[:, mine])
            engine.backward(loss)
            engine.step()
            total += loss.detach().float() / gas
        dist.all_reduce(total)  # the mean over every rank: each holds an equal share of the tokens
        losses.append(total.item() / world)
        seconds.append(time.perf_counter() - start)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "step_seconds": seconds}, f)


if __name__ == "__main__":
    main()
