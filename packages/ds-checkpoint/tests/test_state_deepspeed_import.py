"""Import checkpoints written by the real deepspeed 0.19.8 (fixtures from tools/make_deepspeed_fixtures.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from ds_checkpoint import CheckpointCorruptError, CheckpointNotFoundError, DeepSpeedImportError, load_state
from ds_checkpoint._deepspeed_import import load_deepspeed
from ds_checkpoint._export import export_fp32
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "fixtures"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").is_file())
# ZeRO 0 records no parameter names: the fixture's optimizer groups were (weights, the rest)
ZERO0_ORDER = ["0.weight", "3.weight", "0.bias", "1.weight", "1.bias", "3.bias"]


def _load(case: str):
    return load_deepspeed(
        FIXTURES / case / "ckpt", param_names=ZERO0_ORDER if case.startswith("zero0") else None
    )


def test_all_fixture_cases_present():
    assert {"zero0_fp32", "zero1_fp32", "zero2_fp32"} <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_import_matches_what_deepspeed_held(case):
    facts = json.loads((FIXTURES / case / "expected.json").read_text())
    expected = load_file(FIXTURES / case / "expected.safetensors")
    ckpt = _load(case)
    assert ckpt.zero_stage == facts["zero_stage"] and ckpt.world_size == facts["world_size"]
    assert ckpt.counters["global_steps"] == facts["global_steps"]
    assert ckpt.client_state == facts["client_state"]
    assert ckpt.lr_scheduler == facts["lr_scheduler"]
    for name, tensor in ckpt.model_state.items():
        assert torch.equal(tensor, expected[f"module.{name}"]), name
    seen = set()
    for g, group in enumerate(ckpt.shards[0][1]["groups"]):
        for p in group["params"]:
            n = torch.Size(p["shape"]).numel()
            got = ckpt.read_shard(g, p["offset"], p["offset"] + n)
            for state, prefix in (("master", "fp32"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
                assert torch.equal(got[state].view(p["shape"]), expected[f"{prefix}.{p['name']}"]), (p, state)
            seen.add(p["name"])
    assert seen == {"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"}


@pytest.mark.parametrize("case", ["zero1_fp32", "zero2_fp32"])
def test_padding_is_stripped_and_reshards_to_three_ranks(case):
    ckpt = _load(case)
    groups = ckpt.shards[0][1]["groups"]
    assert [g["numel"] for g in groups] == [18, 11]
    assert ckpt.shards[-1][1]["groups"][0]["shard"] == [10, 18]  # rank 1 holds 10 - 2 padding
    whole = ckpt.read_shard(0, 0, 18)["exp_avg"]
    parts = [ckpt.optimizer_shard([(6 * r, 6 * r + 6), (0, 0)], r, 3)[0]["g0.exp_avg"] for r in range(3)]
    assert torch.equal(torch.cat(parts), whole)


def test_converted_checkpoint_loads_and_exports(tmp_path):
    ckpt = _load("zero2_fp32")
    ckpt.save(tmp_path, "global_step3")
    state = load_state(tmp_path)
    assert state.counters["global_steps"] == 3
    assert torch.equal(state.read_shard(1, 0, 11)["exp_avg_sq"], ckpt.read_shard(1, 0, 11)["exp_avg_sq"])
    export_fp32(tmp_path, tmp_path / "w.safetensors")
    expected = load_file(FIXTURES / "zero2_fp32" / "expected.safetensors")
    weights = load_file(tmp_path / "w.safetensors")
    for name in ("0.weight", "3.bias"):
        assert torch.equal(weights[name], expected[f"fp32.{name}"])


def test_zero0_without_names_fails_clearly():
    with pytest.raises(DeepSpeedImportError, match="pass param_names"):
        load_deepspeed(FIXTURES / "zero0_fp32" / "ckpt")


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_unlisted_class_is_refused_and_never_run(tmp_path, capsys):
    ds = tmp_path / "ds"
    shutil.copytree(FIXTURES / "zero1_fp32" / "ckpt", ds)
    model_file = ds / "global_step3" / "mp_rank_00_model_states.pt"
    sd = torch.load(model_file, weights_only=False)  # our own fixture: trusted here
    sd["evil"] = Evil()
    torch.save(sd, model_file)
    with pytest.raises(DeepSpeedImportError, match="mp_rank_00_model_states.pt: refused"):
        load_deepspeed(ds)
    assert "pwned" not in capsys.readouterr().out


def test_missing_and_truncated_deepspeed_files_are_named(tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(FIXTURES / "zero1_fp32" / "ckpt", ds)
    optim = ds / "global_step3" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    optim.write_bytes(optim.read_bytes()[:1000])
    with pytest.raises(CheckpointCorruptError, match="zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        load_deepspeed(ds)
    optim.unlink()
    with pytest.raises(CheckpointNotFoundError, match="zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        load_deepspeed(ds)


def test_zero3_checkpoint_is_refused_with_what_to_do(tmp_path):
    # DeepSpeed's stage-3 layout: per-rank model-state files and no mp_rank_00_model_states.pt
    tag = tmp_path / "global_step1"
    tag.mkdir()
    (tmp_path / "latest").write_text("global_step1")
    for r in range(2):
        (tag / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt").write_bytes(b"")
    with pytest.raises(DeepSpeedImportError, match="ZeRO stage-3 checkpoint.*zero_to_fp32"):
        load_deepspeed(tmp_path)
