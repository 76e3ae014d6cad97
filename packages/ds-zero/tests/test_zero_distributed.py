"""Multi-process tests (gloo, world sizes 1, 2, 4): every configuration matches single-process training.

Spawning is the expensive part, so each world size is one spawn that runs the whole configuration
list plus the memory, overflow and checkpoint checks. The ranks share this host, so ZeRO's collectives take
the shared-memory transport (``ds_zero._shm``, the default): these runs are also its parity runs, against a
torch.distributed baseline at 2 ranks (test_zero_shm.py checks each collective on its own).
"""

from __future__ import annotations

import _expert_workers as ew
import _parity
import _workers as w
import pytest
import torch
from ds_zero import _transport, shm_collective_calls
from rank_testing import spawn

FP32_TOL = 2e-6
ROUNDTRIP_CFG = {"stage": 2, "reduce_bucket_size": 30, "clip": 0.1, "scaler": True, "optim": "adam"}


def _world2_main(rank: int, world: int) -> dict:
    return w.portable(
        {
            "configs": _parity.run_all(rank, world, shm_collective_calls),
            "memory": w.memory_check(rank, world),
            "overflow": w.overflow_check(rank, world),
            "saved": w.save_state(rank, world, ROUNDTRIP_CFG),
            "overlap1": w.overlap_stage1_check(rank, world),
            "fp32_accum": w.fp32_accum_check(rank, world),
        }
    )


def _other_world_main(rank: int, world: int, saved: dict, full: dict) -> dict:
    saved, full = w.as_tensors(saved), w.as_tensors(full)
    return w.portable(
        {
            # at 4 ranks one configuration per collective path (_parity.BASELINE), at 1 rank all (CI time)
            "configs": _parity.run_all(rank, world, shm_collective_calls, baseline=world == 4),
            "memory": w.memory_check(rank, world),
            "loaded": w.load_state(rank, world, ROUNDTRIP_CFG, saved, full),
            # expert groups partitioned over their expert-data-parallel group (ep 2: 2 ranks; ep 4: 1)
            "experts": ew.run(rank, world, [2, 4]) if world == 4 else [],
        }
    )


@pytest.fixture(scope="module")
def world2() -> list[dict]:
    return w.as_tensors(spawn(_world2_main, 2, timeout_s=600))


def _concatenate(saved_by_rank: list[dict]) -> dict[str, torch.Tensor]:
    """Join every rank's unpadded slice in rank order: the whole flat space of each tensor."""
    keys = saved_by_rank[0]["tensors"].keys()
    return {k: torch.cat([s["tensors"][k] for s in saved_by_rank]) for k in keys}


@pytest.fixture(scope="module")
def other_worlds(world2) -> dict[int, list[dict]]:
    saved = [r["saved"] for r in world2]
    full = _concatenate(saved)
    return {
        ws: w.as_tensors(spawn(_other_world_main, ws, w.portable(saved[0]), w.portable(full), timeout_s=600))
        for ws in (1, 4)
    }


def _results(world2, other_worlds, world_size: int) -> list[dict]:
    return world2 if world_size == 2 else other_worlds[world_size]


@pytest.mark.parametrize(
    ("world_size", "cfg"),
    [(n, c) for n in (1, 2, 4) for c in w.CONFIGS if n != 4 or c["name"] in _parity.BASELINE],
    ids=lambda v: v["name"] if isinstance(v, dict) else str(v),
)
def test_matches_single_process(world2, other_worlds, world_size, cfg):
    for rank, result in enumerate(_results(world2, other_worlds, world_size)):
        diff = result["configs"][cfg["name"]]["diff"]
        assert diff <= cfg.get("tol", FP32_TOL), f"rank {rank}: max weight difference {diff}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_shared_memory_carried_every_configuration(world2, other_worlds, world_size):
    """Every configuration (and stage 3's check) went over shared memory; every rank holds the same bits."""
    _parity.check([r["configs"] for r in _results(world2, other_worlds, world_size)], lambda _: True, "shm")


def _baseline_main(rank: int, world: int) -> dict:
    return _parity.run_all(rank, world, shm_collective_calls, baseline=True)


def test_shared_memory_and_gloo_train_identical_weights_at_two_ranks(world2):
    gloo = spawn(_baseline_main, 2, timeout_s=600, env={_transport.ENV: "torch"})[0]
    assert all(r["calls"] == 0 for r in gloo.values()), f"{_transport.ENV}=torch still used shared memory"
    assert _parity.same_weights(world2[0]["configs"], gloo)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_optimizer_state_bytes_follow_zero_formula(world2, other_worlds, world_size):
    for result in _results(world2, other_worlds, world_size):
        for m in result["memory"]:
            assert abs(m["state_bytes"] - m["formula_bytes"]) <= 0.01 * m["formula_bytes"], m
            # fp32 weights: the master partition is a view of them (no second copy), and no gradient
            # buffer outlives the step (nothing reads it before the next backward)
            assert m["master_bytes"] == 0 and m["grad_bytes"] == 0, m


def test_overflow_skips_step_on_every_rank(world2):
    for result in world2:
        o = result["overflow"]
        assert o == {"stepped": False, "updates": [True], "scale": 512.0, "unchanged": True, "skipped": 1}


def test_sharded_state_has_no_padding_and_covers_the_space(world2):
    metas = [r["saved"]["meta"] for r in world2]
    for g in range(len(metas[0]["groups"])):
        numel = metas[0]["groups"][g]["numel"]
        shards = [m["groups"][g]["shard"] for m in metas]
        assert shards[0][0] == 0 and shards[-1][1] == numel
        assert all(a[1] == b[0] for a, b in zip(shards, shards[1:]))
        for r, m in enumerate(metas):
            s0, s1 = m["groups"][g]["shard"]
            tensors = world2[r]["saved"]["tensors"]
            assert tensors[f"g{g}.master"].numel() == s1 - s0
            assert tensors[f"g{g}.exp_avg"].numel() == s1 - s0
        assert metas[0]["groups"][g]["scalars"]["step"] == 2
    assert metas[0]["format"] == "ds-flat-shard/1"
    assert metas[0]["groups"][0]["params"][0]["name"] == "emb.weight"


@pytest.mark.parametrize("world_size", [1, 4])
def test_reload_at_other_world_size_continues_identically(world2, other_worlds, world_size):
    expected = world2[0]["saved"]["final"]
    for result in other_worlds[world_size]:
        loaded = result["loaded"]
        diff = max(float((loaded["final"][k] - v).abs().max()) for k, v in expected.items())
        assert diff <= FP32_TOL, diff
        assert loaded["scaler"] == world2[0]["saved"]["scaler"]


def test_stage1_overlap_launches_reductions_during_the_boundary_backward(world2):
    for result in world2:
        runs = result["overlap1"]
        buckets = runs["plain"]["buckets"]
        assert buckets >= 3, "the check needs several buckets"
        # without overlap nothing is in flight after any backward: step() reduces
        assert runs["plain"]["inflight"] == [0] * (w.GAS * w.STEPS)
        for name in ("overlap", "overlap_contig", "overlap_offload"):
            # non-boundary backwards launch nothing; the boundary one launched every bucket
            assert runs[name]["inflight"] == ([0] * (w.GAS - 1) + [buckets]) * w.STEPS, name
            for key, value in runs[name]["weights"].items():
                assert torch.equal(value, runs["plain"]["weights"][key]), (name, key)


def test_fp32_grad_accum_is_closer_to_fp32_and_is_counted(world2):
    totals = {k: sum(r["fp32_accum"][k]["err_sq"] for r in world2) for k in world2[0]["fp32_accum"]}
    for stage in (1, 2):
        bf16, fp32 = totals[f"s{stage}_bf16"], totals[f"s{stage}_fp32"]
        # both include the bf16 forward/backward's own rounding (measured ratio about 0.6-0.7 here),
        # so the margin is modest; equal accumulation would give a ratio of 1
        assert fp32 < 0.85 * bf16, (stage, bf16, fp32)
    for result in world2:
        m = result["fp32_accum"]
        part, padded, numel = (m["s2_fp32"][k] for k in ("partition", "padded", "numel"))
        # measured after the last backward, before the step frees them. Stage 2: the partition
        # gradient is fp32 instead of bf16
        assert m["s2_fp32"]["grad_bytes"] - m["s2_bf16"]["grad_bytes"] == 2 * part
        # stage 1: one fp32 flat accumulation buffer instead of the bf16 .grad tensors
        assert m["s1_fp32"]["grad_bytes"] - m["s1_bf16"]["grad_bytes"] == 4 * padded - 2 * numel


def _error(mine: dict, ref: dict) -> float:
    return max(float((mine[k] - v).abs().max()) for k, v in ref.items())


def test_expert_groups_train_like_one_process_holding_every_expert(other_worlds):
    """ZeRO 1/2 with the experts' param group partitioned over the ranks holding the same expert
    (``partition_groups``), at 4 ranks with ep 2 and 4, against one process holding every expert
    (_expert_workers.py): weights, the norm over dense and every expert, the full expert weight."""
    refs: dict = {}
    for rank, result in enumerate(other_worlds[4]):
        for r in (r for r in result["experts"] if not r.get("unwired")):
            key = (r["ep"], str(r["cfg"]))
            if key not in refs:
                refs[key] = ew.reference(r["cfg"], 4, r["ep"])
            dense, experts, norm = refs[key]
            assert r["expert_partition"] == 4 // r["ep"], key
            assert _error(r["dense"], dense) <= FP32_TOL, (rank, key, "dense")
            assert _error(r["expert"], experts[rank % r["ep"]]) <= FP32_TOL, (rank, key, "expert")
            assert abs(r["norm"] - norm) <= 1e-5 * norm, (rank, key, r["norm"], norm)
            assert r["full_expert_weight_error"] == 0.0, (rank, key)


def test_experts_partitioned_over_the_world_diverge(other_worlds):
    """The same run without ``partition_groups`` mixes the ranks' different experts: far off."""
    for rank, result in enumerate(other_worlds[4]):
        unwired = [r for r in result["experts"] if r.get("unwired")]
        assert len(unwired) == 2
        for r in unwired:
            _, experts, _ = ew.reference(r["cfg"], 4, r["ep"])
            assert _error(r["expert"], experts[rank % r["ep"]]) > 1e-3, (rank, r["ep"])
