"""Rank functions of the tensor-parallel tests (module level: rank_testing.spawn imports them)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def tiny_llama(seed: int = 0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, attn_implementation="eager",
    )  # fmt: skip
    kw.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**kw))


def batch(step: int, n: int = 2, seq: int = 8, vocab: int = 64):
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, vocab, (n, seq), generator=g)
    return ids


def train_losses(group, steps=3, overlap=False, specs=None, preset=None, vocab=None, **model_kw):
    """Losses of a few SGD steps of the tiny Llama split over ``group`` (None: not split)."""
    from ds_tpsp.tensor import shard_model

    model = tiny_llama(**model_kw)
    plan = (
        shard_model(
            model,
            group,
            overlap_comm=overlap,
            partition_config=specs,
            preset_model=preset,
            vocab_parallel_lm_head=vocab,
        )
        if group
        else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        ids = batch(step)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, plan.layers if plan else {}, plan.source if plan else None, _grad_fn_name(model)


def _grad_fn_name(model):
    ids = batch(0)
    return type(model.model.layers[0].self_attn.q_proj(model.model.embed_tokens(ids)).grad_fn).__name__


def everything(rank, world):
    """Every check of test_tensor_parallel.py in one 2-rank run (starting ranks is the slow part)."""
    group = dist.group.WORLD
    out = {
        "reference": train_losses(None),
        "tp2": train_losses(group),
        "overlap": train_losses(group, overlap=True),
    }
    out["preset"] = train_losses(group, preset="llama")
    out["vocab"] = vocab_parallel(group)
    out["errors"] = {str(i): shard_error(o) for i, o in enumerate(ERROR_CASES)}
    out["round_trip"] = full_weights_round_trip()
    out["config"] = from_config(group)
    return out


def from_config(group):
    """shard_model driven by a loaded ds_config section; what it read, did, and refused."""
    from ds_config import load_config
    from ds_config.testing import ConfigReads
    from ds_tpsp.tensor import TensorParallelError, shard_model

    head = {"patterns": [r".*lm_head\.weight$"], "partition_type": "column", "gather_output": True}
    section = {
        "autotp_size": 2,
        "tp_overlap_comm": True,
        "preset_model": "llama",
        "partition_config": {"use_default_specs": True, "layer_specs": [head]},
    }
    reads = ConfigReads()
    cfg = reads.wrap(load_config({"train_batch_size": 2, "tensor_parallel": section}))
    model = tiny_llama()
    plan = shard_model(model, group, cfg.tensor_parallel)
    got = {"read": sorted(reads.read_by("ds_tpsp")), "layers": plan.layers, "source": plan.source}
    got["grad_fn"] = _grad_fn_name(model)
    alone = {**section, "partition_config": {"use_default_specs": False, "layer_specs": [head]}}
    got["alone"] = shard_model(
        tiny_llama(), group, load_config({"train_batch_size": 2, "tensor_parallel": alone}).tensor_parallel
    ).layers
    strict = {
        **section,
        "partition_config": {"strict_mode": True, "layer_specs": [{"patterns": [r".*_proj\.weight$"]}]},
    }
    vocab = {**section, "vocab_parallel_lm_head": True}
    got["vocab"] = shard_model(
        tiny_llama(), group, load_config({"train_batch_size": 2, "tensor_parallel": vocab}).tensor_parallel
    ).layers["lm_head"]
    for key, bad in (("strict", strict), ("size", {"autotp_size": 4})):
        try:
            shard_model(
                tiny_llama(),
                group,
                load_config({"train_batch_size": 2, "tensor_parallel": bad}).tensor_parallel,
            )
            got[key] = None
        except (TensorParallelError, NotImplementedError) as exc:
            got[key] = str(exc)
    return got


ERROR_CASES = [
    {"num_key_value_heads": 1},
    {"num_attention_heads": 3, "num_key_value_heads": 3, "hidden_size": 36},
    {"intermediate_size": 66 - 3},
]


def shard_error(overrides, specs=None):
    from ds_tpsp.tensor import TensorParallelError, shard_model

    model = tiny_llama(**overrides)
    before = [n for n, _ in model.named_modules()]
    try:
        shard_model(model, dist.group.WORLD, partition_config=specs)
    except TensorParallelError as exc:
        untouched = [n for n, _ in model.named_modules()] == before and not hasattr(model, "ds_tp_group")
        return str(exc), untouched
    return None, None


def full_weights_round_trip():
    """The split model's whole weights equal the unsplit model's; loading them back gives the same shards."""
    from ds_tpsp.tensor import full_state_dict, load_full_state_dict, shard_model

    reference = tiny_llama().state_dict()
    model = tiny_llama()
    shard_model(model, dist.group.WORLD)
    full = full_state_dict(model, dist.group.WORLD)
    same = full.keys() == reference.keys() and all(torch.equal(full[k], reference[k]) for k in reference)
    local = {k: v.clone() for k, v in model.state_dict().items()}
    load_full_state_dict(model, full, dist.group.WORLD)
    back = all(torch.equal(local[k], v) for k, v in model.state_dict().items())
    return same, back


def vocab_parallel(group):
    """vocab_parallel_lm_head: the head split over the vocabulary with split logits and the vocab-parallel loss
    (untied and tied to the embedding), null's automatic choice, and the errors."""
    import torch.nn as nn
    from ds_tpsp.tensor import TensorParallelError, shard_model

    out = {
        "untied": train_losses(group, vocab=True),
        "tied_reference": train_losses(None, tie_word_embeddings=True),
        "tied": train_losses(group, vocab=True, tie_word_embeddings=True),
    }
    model = tiny_llama()
    shard_model(model, group, vocab_parallel_lm_head=True)
    ids = batch(0)
    labels = ids.clone()
    labels[:, :3] = -100  # ignored tokens; the Trainer's num_items_in_batch divides the sum
    whole = tiny_llama()
    with torch.no_grad():
        result = model(input_ids=ids, labels=labels)
        out["logits_shape"] = list(result.logits.shape)
        out["masked"] = (result.loss.item(), whole(input_ids=ids, labels=labels).loss.item())
        out["items"] = (
            model(input_ids=ids, labels=labels, num_items_in_batch=7).loss.item(),
            whole(input_ids=ids, labels=labels, num_items_in_batch=7).loss.item(),
        )
    tied = tiny_llama(tie_word_embeddings=True)
    shard_model(tied, group, vocab_parallel_lm_head=True)
    out["tied_shares"] = tied.model.embed_tokens.weight is tied.lm_head.weight and list(
        tied.lm_head.weight.shape
    )

    def planned(vocab, tie=True):  # a plan that shards the embedding (embedding_rowwise), as GPT-NeoX's does
        model = tiny_llama(tie_word_embeddings=tie)
        model.config.base_model_tp_plan = {
            **model.config.base_model_tp_plan,
            "embed_tokens": "embedding_rowwise",
        }
        layers = shard_model(model, group, vocab_parallel_lm_head=vocab).layers
        return layers.get("lm_head"), layers.get("model.embed_tokens")

    out["auto"] = [planned(None), planned(False), planned(None, tie=False)]

    class NoHook(nn.Module):  # a head but no Hugging Face loss_function to put the vocab-parallel loss in
        def __init__(self):
            super().__init__()
            self.up_proj, self.lm_head = nn.Linear(4, 4), nn.Linear(4, 8)

    errors = {}
    for key, make in (
        ("rows", lambda: tiny_llama(vocab_size=63)),
        ("no_head", lambda: tiny_llama().model),
        ("no_hook", NoHook),
    ):
        model = make()
        before = [n for n, _ in model.named_modules()]
        try:
            shard_model(model, group, vocab_parallel_lm_head=True)
            errors[key] = None
        except TensorParallelError as exc:
            errors[key] = (str(exc), [n for n, _ in model.named_modules()] == before)
    out["errors"] = errors
    return out
