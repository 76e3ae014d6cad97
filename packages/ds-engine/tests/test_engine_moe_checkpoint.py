"""Checkpoints of a model with ds_moe layers at expert parallelism > 1 (gloo): each expert saved under its
global index, resumed at another world size and expert-parallel degree, optimizer state included, with the
losses of the run that was never interrupted; the consolidated fp32 weights hold every expert.

One global batch per step, cut into ``CHUNKS`` micro-batches: rank r's i-th micro-step takes chunk
``i * world + r``, so world 4 (no accumulation), world 2 (2 micro-steps) and world 1 (4) see the same
tokens per expert's capacity and the same mean loss. Routing is deterministic (top-1, no random token
selection) and every expert starts from weights of its own (drawn from its global index)."""

from __future__ import annotations

import pytest
from rank_testing import spawn

HIDDEN, EXPERTS, CHUNKS, MICRO = 8, 4, 4, 4


def _model(rank: int, ep: int):
    import ds_moe
    import torch
    from torch import nn

    torch.manual_seed(0)
    moe = ds_moe.MoE(HIDDEN, nn.Linear(HIDDEN, HIDDEN), num_experts=EXPERTS, ep_size=ep, use_rts=False)
    ep_rank = rank % ep  # DeepSpeed's layout: consecutive ranks form an expert-parallel group
    with torch.no_grad():
        for j, expert in enumerate(moe.deepspeed_moe.experts.deepspeed_experts):
            g = torch.Generator().manual_seed(100 + ep_rank * moe.num_local_experts + j)
            for p in expert.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return nn.ModuleList([nn.Linear(HIDDEN, HIDDEN), moe])


def _chunk(step: int, c: int):
    import torch

    g = torch.Generator().manual_seed(1000 * step + c)
    return torch.randn(MICRO, 4, HIDDEN, generator=g), torch.randn(MICRO, 4, HIDDEN, generator=g)


def _run(
    rank: int,
    world: int,
    ep: int,
    stage: int,
    steps: tuple[int, int],
    save_dir: str,
    load: str | None,
    save: dict,
    client: bool = False,
) -> dict:
    """Train steps [steps[0], steps[1]) at ``ep`` and ZeRO ``stage`` (loading tag ``load`` first), saving after
    the steps in ``save`` ({step: tag}); returns the global mean loss per step and the experts at each save.
    ``client``: the script's own optimizer, one param group mixing experts with the dense weights (stage 0)."""
    import ds_engine
    import torch
    from ds_engine.topology import reset_topology

    reset_topology()
    gas = CHUNKS // world
    model = _model(rank, ep)
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.02}},
        "zero_optimization": {"stage": stage},
    }
    optimizer = None
    if client:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
        del config["optimizer"]
    engine, *_ = ds_engine.initialize(model=model, optimizer=optimizer, config=config)
    moe = model[1]
    if ep > 1:
        assert torch.distributed.get_rank(moe.deepspeed_moe.ep_group) == rank % ep
    local = moe.deepspeed_moe.experts.deepspeed_experts

    def experts_by_global_index():
        return {
            (rank % ep) * moe.num_local_experts + j: e.weight.detach().clone() for j, e in enumerate(local)
        }

    loaded = None
    if load is not None:
        # the weights alone first (the full load below takes the optimizer's fp32 copy of them)
        engine.load_checkpoint(save_dir, load, load_module_only=True)
        loaded = experts_by_global_index()
        path, _ = engine.load_checkpoint(save_dir, load)
        assert path is not None
    losses, experts = {}, {}
    for step in range(*steps):
        total = torch.zeros(())
        for i in range(gas):
            x, y = _chunk(step, i * world + rank)
            out, l_aux, _ = moe(model[0](x))
            loss = (out - y).square().mean() + 0.1 * l_aux
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        torch.distributed.all_reduce(total)
        losses[step] = total.item() / CHUNKS
        if step + 1 in save:
            engine.save_checkpoint(save_dir, save[step + 1])
            engine.save_16bit_model(save_dir, f"{save[step + 1]}.safetensors")
            experts[step + 1] = experts_by_global_index()
    return {"losses": losses, "experts": experts, "loaded": loaded}


def _one_group(rank: int, world: int, save_dir: str) -> list[dict]:
    """ep 2 with one param group for experts and dense weights, saved after step 2 and run on; then, in the
    same processes, ep 1 resumes that checkpoint."""
    full = _run(rank, world, 2, 0, (0, 4), save_dir, None, {2: "m2"}, client=True)
    return [full, _run(rank, world, 1, 0, (2, 4), save_dir, "m2", {}, client=True)]


def _experts(results: list[dict], key: str, step: int | None = None) -> dict:
    """Every rank's experts by global index (the expert-data replicas of one expert agree)."""
    out: dict = {}
    for r in results:
        for e, w in (r[key][step] if step is not None else r[key]).items():
            assert e not in out or out[e].equal(w), e
            out[e] = w
    assert sorted(out) == list(range(EXPERTS))
    return out


def _losses(results: list[dict]) -> dict[int, float]:
    assert all(r["losses"] == results[0]["losses"] for r in results)
    return results[0]["losses"]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """ep 2 at world 4 (ZeRO 0, 2 expert-data replicas) never interrupted, saving after step 2; ep 2 at world 2
    (ZeRO 1) resumes it and saves after step 4; ep 1 at world 1 (ZeRO 2) resumes that and saves after step 6;
    ep 2 at world 4 (ZeRO 2: each expert partitioned over its 2 replicas) resumes that and saves after step 8."""
    d = str(tmp_path_factory.mktemp("moe-ckpt"))
    full = spawn(_run, 4, 2, 0, (0, 8), d, None, {2: "a2"}, timeout_s=300)
    world2 = spawn(_run, 2, 2, 1, (2, 4), d, "a2", {4: "b4"}, timeout_s=300)
    world1 = spawn(_run, 1, 1, 2, (4, 6), d, "b4", {6: "c6"}, timeout_s=300)
    back = spawn(_run, 4, 2, 2, (6, 8), d, "c6", {8: "d8"}, timeout_s=300)
    return d, full, world2, world1, back


def test_resume_at_other_world_size_and_expert_parallel_degree(chain):
    _, full, world2, world1, back = chain
    reference = _losses(full)
    runs = (
        (full, world2, 2, "ep2 world4 ZeRO 0 -> ep2 world2 ZeRO 1"),
        (world2, world1, 4, "ep2 world2 ZeRO 1 -> ep1 world1 ZeRO 2"),
        (world1, back, 6, "ep1 world1 ZeRO 2 -> ep2 world4 ZeRO 2"),
    )
    for saver, resumed, step, what in runs:
        # each rank's experts are the saved experts of its global indices ...
        saved, loaded = _experts(saver, "experts", step), _experts(resumed, "loaded")
        assert all(saved[e].equal(loaded[e]) for e in saved), what
        # ... and training goes on as if never interrupted (optimizer state included)
        for s, loss in _losses(resumed).items():
            assert loss == pytest.approx(reference[s], abs=1e-5, rel=0), (what, s)


def test_whole_weights_hold_every_expert_under_its_global_index(chain):
    import ds_checkpoint
    import torch
    from safetensors.torch import load_file

    d, full, world2, _, back = chain
    prefix = "1.deepspeed_moe.experts.deepspeed_experts."
    for tag, step, saver in (("a2", 2, full), ("b4", 4, world2), ("d8", 8, back)):
        saved = _experts(saver, "experts", step)
        files = ds_checkpoint.load_state(d, tag).model_state  # the weight files
        weights = ds_checkpoint.fp32_state_dict(d, tag)  # zero_to_fp32's: parameters from the fp32 masters
        whole = load_file(f"{d}/{tag}.safetensors")  # engine.save_16bit_model's
        for e, w in saved.items():
            for what, state in (("files", files), ("fp32", weights), ("16bit", whole)):
                assert torch.equal(state[f"{prefix}{e}.weight"], w), (tag, what, e)
        # all are whole weights: they load into the same model at ep 1 (every expert on one rank)
        for state in (files, weights, whole):
            _model(0, 1).load_state_dict(state, strict=True)


def test_one_param_group_mixing_experts_and_dense_weights_resumes_at_another_ep(tmp_path):
    import ds_checkpoint
    from safetensors.torch import load_file

    runs = spawn(_one_group, 2, str(tmp_path), timeout_s=300)
    full, resumed = [r[0] for r in runs], [r[1] for r in runs]
    saved, loaded = _experts(full, "experts", 2), _experts(resumed, "loaded")
    assert all(saved[e].equal(loaded[e]) for e in saved)
    (group,) = ds_checkpoint.load_state(tmp_path, "m2", load_model=False).optimizer_groups
    names = [p["name"] for p in group["params"]]
    assert len(names) == len(set(names)) == len(_model(0, 1).state_dict())  # every weight once, experts too
    ds_checkpoint.export_fp32(tmp_path, tmp_path / "whole.safetensors", tag="m2")
    whole = load_file(tmp_path / "whole.safetensors")
    assert all(
        whole[f"1.deepspeed_moe.experts.deepspeed_experts.{e}.weight"].equal(w) for e, w in saved.items()
    )
    _model(0, 1).load_state_dict(whole, strict=True)
    reference = _losses(full)
    for s, loss in _losses(resumed).items():
        assert loss == pytest.approx(reference[s], abs=1e-5, rel=0), s
