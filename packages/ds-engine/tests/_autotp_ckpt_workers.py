"""Rank functions of test_autotp_checkpoint.py: a tiny decoder laid out as a Hugging Face Llama (grouped-query
attention, a gated MLP, its own ``_tp_plan``; no transformers import, which costs each rank seconds) trained
with AutoTP, saved with ``save_checkpoint`` and resumed at other tensor-parallel degrees, data-parallel sizes,
ZeRO stages and world sizes. Every run sees the same global batch of GLOBAL rows per step (each data-parallel
rank its rows)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

GLOBAL, SEQ, VOCAB, DIM, HEADS, KV_HEADS = 4, 8, 64, 32, 4, 2
HEAD_DIM = DIM // HEADS


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(DIM, HEADS * HEAD_DIM)  # a bias split with the rows
        self.k_proj = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, DIM)  # a whole bias after the row-parallel sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (
            p(x).view(b, s, -1, HEAD_DIM).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))  # this rank's heads
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(a.transpose(1, 2).reshape(b, s, -1))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.self_attn = Attention()
        self.mlp = nn.Module()
        self.mlp.gate_proj, self.mlp.up_proj = (
            nn.Linear(DIM, 2 * DIM, bias=False),
            nn.Linear(DIM, 2 * DIM, bias=False),
        )
        self.mlp.down_proj = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class TinyLlama(nn.Module):
    _tp_plan = {  # noqa: RUF012 (Hugging Face's spelling: a class attribute)
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
        "lm_head": "colwise_rep",
    }

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def tiny_llama() -> TinyLlama:
    torch.manual_seed(0)
    return TinyLlama()


def batch(step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (GLOBAL, SEQ), generator=torch.Generator().manual_seed(100 + step))


def engine(tp: int, zero: int):
    """An engine over a fresh tiny Llama at ``tp`` (the data axis takes the rest of the world)."""
    import ds_engine
    from ds_engine.topology import reset_topology

    reset_topology()  # each engine of a run builds its own topology
    dp = dist.get_world_size() // tp
    config = {
        "train_micro_batch_size_per_gpu": GLOBAL // dp,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-2, "warmup_num_steps": 4}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": zero},
        "tensor_parallel": {"autotp_size": tp},
        "steps_per_print": 1000,
    }
    model = tiny_llama()
    eng, *_ = ds_engine.initialize(model=model, model_parameters=model.parameters(), config=config)
    return eng


def train(eng, steps: range) -> list[float]:
    """The mean loss over the global batch of each step."""
    dp = _dp(eng)
    rank = dist.get_rank() // (dist.get_world_size() // dp)  # tensor-parallel ranks are consecutive
    rows = GLOBAL // dp
    losses = []
    for step in steps:
        ids = batch(step)[rank * rows : (rank + 1) * rows]
        loss = eng(ids)
        eng.backward(loss)
        eng.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    return losses


def _dp(eng) -> int:
    from ds_tpsp.tensor import tp_group_of

    group = tp_group_of(eng.module)
    return dist.get_world_size() // (dist.get_world_size(group) if group is not None else 1)


def save_tp2_dp2(rank: int, world: int, root: str) -> dict:
    """4 ranks, tp 2 x dp 2, ZeRO 2: two steps, save, two more steps (the uninterrupted run)."""
    eng = engine(2, 2)
    first = train(eng, range(2))
    eng.save_checkpoint(root, tag="tp2dp2")
    return {"first": first, "rest": train(eng, range(2, 4)), "q_rows": _q_rows(eng)}


def resume_chain(rank: int, world: int, root: str) -> dict:
    """2 ranks. tp 2 (ZeRO 1) resumes the 4-rank tp 2 x dp 2 checkpoint and saves again; tp 1 x dp 2 (ZeRO 2)
    resumes that and saves again; tp 2 (ZeRO 0) resumes the tp-1 checkpoint. Each trains the last two steps."""
    out = {}
    for name, tp, zero, source, save in (
        ("tp2_from_tp2dp2", 2, 1, "tp2dp2", "tp2"),
        ("tp1_from_tp2", 1, 2, "tp2", "tp1"),
        ("tp2_from_tp1", 2, 0, "tp1", None),
    ):
        eng = engine(tp, zero)
        eng.load_checkpoint(root, tag=source)
        if save:
            eng.save_checkpoint(root, tag=save)
        out[name] = {"rest": train(eng, range(2, 4)), "steps": eng.global_steps, "q_rows": _q_rows(eng)}
    # the last engine (tp 2) writes the whole weights both ways; rank 0 reports its loss on one more batch
    eng.save_16bit_model(root + "/16bit")
    eng.save_checkpoint(root, tag="end")
    eng.eval()
    with torch.no_grad():
        ids = batch(9)
        out["eval_loss"] = eng(ids).item()
    return out


def _q_rows(eng) -> int:
    return eng.module.layers[0].self_attn.q_proj.weight.shape[0]
