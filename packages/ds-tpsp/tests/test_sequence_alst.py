"""ALST on a tiny Hugging Face Llama (from a config in code) at sp 2, real gloo ranks: the data loader adapter's
slices, and the loss (token-weighted over the sequence group, as transformers' Trainer computes it) and the
gradients summed over the group equal the whole-sequence model's. Skipped without transformers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from ds_tpsp.sequence import SequenceParallelError
from ds_tpsp.sequence.alst import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
from rank_testing import spawn

pytest.importorskip("transformers")

SEQ, VOCAB = 16, 64


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def batch_of(rank: int) -> dict:
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(rank))
    ids[0, -3:] = ids[0, :3]  # some structure; the last label is padding after the shift
    return {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(SEQ)[None]}


def _alst(rank: int, world: int) -> dict:
    group = dist.group.WORLD
    model = tiny_llama()
    UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", world, 1, SEQ, False, process_group=group)
    loader = UlyssesSPDataLoaderAdapter([batch_of(rank)], rank, group, world, "cpu")
    assert len(loader) == world
    out = {"losses": [], "grads": [], "slices": []}
    for micro in loader:
        out["slices"].append(micro["input_ids"].clone())
        model.zero_grad()
        loss = model(input_ids=micro["input_ids"], position_ids=micro["position_ids"],
                     labels=micro["shift_labels"], shift_labels=micro["shift_labels"]).loss  # fmt: skip
        good = (micro["shift_labels"] != -100).sum()
        local = loss * good
        totals = torch.stack((local.detach(), good.float()))
        dist.all_reduce(totals, group=group)
        (local + (totals[0] - local.detach())).div(totals[1]).backward()  # each rank its own share
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(grads, group=group)  # what DeepSpeed's reduction sums over the sequence group
        out["losses"].append((totals[0] / totals[1]).item())
        out["grads"].append(grads)
    try:
        UlyssesSPAttentionHF(None, 1, 6, 8, 6, 2, group)  # 6 heads over 4 ranks
    except SequenceParallelError as err:
        out["bad_heads"] = str(err)
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn(_alst, 4)


def test_alst_llama_loss_and_gradients_equal_the_whole_sequence(ranks: list[dict]) -> None:
    model = tiny_llama()
    for source in range(4):  # the group computes rank 0's batch, then rank 1's, ...
        b = batch_of(source)
        model.zero_grad()
        loss = model(input_ids=b["input_ids"], labels=b["labels"]).loss
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        for r, result in enumerate(ranks):
            assert result["slices"][source].tolist() == b["input_ids"][:, r * 4 : (r + 1) * 4].tolist()
            assert result["losses"][source] == pytest.approx(loss.item(), rel=1e-5)
            torch.testing.assert_close(result["grads"][source], grads, rtol=1e-4, atol=1e-6)


def test_heads_not_divisible_names_module_and_numbers(ranks: list[dict]) -> None:
    message = ranks[0]["bad_heads"]
    assert "UlyssesSPAttentionHF" in message and "6 attention heads" in message and "degree 4" in message
