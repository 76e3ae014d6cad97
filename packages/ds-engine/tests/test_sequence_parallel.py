"""``sequence_parallel_size`` in the engine (real gloo ranks): the groups, the batch math, DeepSpeed's gradient
(summed over data x sequence, divided by the data-parallel size) and the error for a degree that does not divide
the world. The DeepSpeed-parity runs of a Ulysses script are integration/test_ulysses_parity.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from ds_tpsp.sequence import DistributedAttention
from rank_testing import spawn

SEQ, DIM, HEADS, VOCAB = 16, 16, 2, 32


def _attention(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(
        1, 2
    )


class TinyUlysses(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.qkv, self.head = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, VOCAB)
        self.attn = _attention  # the engine's sequence group is put in after initialize (below)

    def forward(self, tokens, labels):
        q, k, v = self.qkv(self.emb(tokens)).unflatten(-1, (3, HEADS, -1)).unbind(2)
        a = self.attn(q, k, v, 0) if isinstance(self.attn, DistributedAttention) else self.attn(q, k, v)
        return F.cross_entropy(self.head(a.flatten(2)).flatten(0, 1), labels.flatten())


def _data():
    tokens = torch.randint(0, VOCAB, (3, 2, SEQ + 1), generator=torch.Generator().manual_seed(1))
    return tokens[..., :-1], tokens[..., 1:]


def reference(sp: int) -> list[float]:
    """One process, whole sequences, torch SGD on sp x the mean loss: the gradient DeepSpeed's Ulysses takes
    (the sum over the sp ranks of each rank's mean over its slice)."""
    model = TinyUlysses()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for tokens, labels in zip(*_data()):
        loss = model(tokens, labels)
        opt.zero_grad()
        (loss * sp).backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _engine_run(rank: int, world: int, stage: int) -> dict:
    import ds_engine
    import torch.distributed as dist
    from ds_tpsp.sequence import SequenceParallelError

    base = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
            "optimizer": {"type": "SGD", "params": {"lr": 0.5}}, "zero_allow_untested_optimizer": True}  # fmt: skip
    with pytest.raises(
        SequenceParallelError
    ) as bad:  # a degree that does not divide the world: before any group
        ds_engine.initialize(model=TinyUlysses(), config={**base, "sequence_parallel_size": 3})
    model = TinyUlysses()
    engine, *_ = ds_engine.initialize(model=model, config={**base, "sequence_parallel_size": world})
    model.attn = DistributedAttention(_attention, engine.get_sequence_parallel_group(), 2, 1)
    chunk = SEQ // world
    losses = []
    for tokens, labels in zip(*_data()):
        mine = slice(rank * chunk, (rank + 1) * chunk)
        loss = engine(tokens[:, mine], labels[:, mine])
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    return {
        "losses": losses,
        "error": str(bad.value),
        "sizes": (engine.dp_world_size, engine.sequence_parallel_size, engine.seq_dp_world_size),
    }


@pytest.mark.parametrize("stage", [1])
def test_sequence_parallel_size_trains_with_deepspeeds_gradient(stage: int) -> None:
    results = spawn(_engine_run, 2, stage)
    for result in results:
        assert result["sizes"] == (1, 2, 2)  # data-parallel size world / sp; ZeRO over data x sequence
        assert result["losses"] == pytest.approx(reference(2), rel=1e-5)
    message = results[0]["error"]
    assert "sequence_parallel_size" in message and "degree 3" in message and "world size 2" in message
