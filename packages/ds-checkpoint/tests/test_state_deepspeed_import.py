"""Import checkpoints written by the real deepspeed 0.19.8 (fixtures from tools/fixtures/make_deepspeed_fixtures.py)."""

from __future__ import annotations

import json
import shutil
import warnings
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
    assert {"zero0_fp32", "zero1_fp32", "zero2_fp32", "zero3_fp32"} <= set(CASES)


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
    assert seen == {k.partition(".")[2] for k in expected if k.startswith("fp32.")}


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


ZERO3 = [c for c in CASES if c.startswith("zero3")]


@pytest.mark.parametrize("case", ZERO3)
def test_zero3_weights_equal_deepspeeds_zero_to_fp32(case):
    # DeepSpeed's own consolidation of the same files, recorded when the fixture was made
    expected = load_file(FIXTURES / case / "expected.safetensors")
    consolidated = {k.partition(".")[2]: v for k, v in expected.items() if k.startswith("zero_to_fp32.")}
    ckpt = _load(case)
    whole = ckpt.optimizer_shard([(0, g["numel"]) for g in ckpt.shards[0][1]["groups"]], 0, 1)[0]
    masters = {}
    for g, group in enumerate(ckpt.shards[0][1]["groups"]):
        for p in group["params"]:
            n = torch.Size(p["shape"]).numel()
            masters[p["name"]] = whole[f"g{g}.master"][p["offset"] : p["offset"] + n].view(p["shape"])
    buffers = {k for k in consolidated if ".running_" in k or k.endswith("num_batches_tracked")}
    assert set(masters) == set(consolidated) - buffers - {"5.weight"}  # the tied weight is stored once
    for name, tensor in masters.items():
        assert torch.equal(tensor, consolidated[name]), name
    for name in buffers:
        assert torch.equal(ckpt.model_state[name].float(), consolidated[name].float()), name
    # the module state names the tied weight twice, as DeepSpeed's consolidation does
    tied = ckpt.model_state["5.weight"]
    assert torch.equal(tied, consolidated["5.weight"].to(tied.dtype))


@pytest.mark.parametrize("case", ZERO3)
def test_zero3_module_state_is_complete(case):
    expected = load_file(FIXTURES / case / "expected.safetensors")
    module = {k.partition(".")[2]: v for k, v in expected.items() if k.startswith("module.")}
    ckpt = _load(case)
    assert set(ckpt.model_state) == set(module)
    for name, tensor in module.items():
        assert ckpt.model_state[name].dtype == tensor.dtype and torch.equal(ckpt.model_state[name], tensor), (
            name
        )


def test_zero3_groups_hold_no_padding():
    # 0.bias has 3 elements at 2 ranks: rank 0 holds [0, 2), rank 1 holds [2] and one pad element, and
    # the next parameter's slice follows the pad; the import drops it (that it does not shift what follows
    # is checked value by value in the tests above). Padded, the groups would be 14*2 and 11*2 long.
    ckpt = _load("zero3_fp32")
    bias_group = ckpt.shards[0][1]["groups"][1]
    assert [p["name"] for p in bias_group["params"]] == [
        "0.bias",
        "1.weight",
        "1.bias",
        "3.bias",
        "5.bias",
        "7.bias",
    ]
    assert bias_group["numel"] == 17 and ckpt.shards[0][1]["groups"][0]["numel"] == 27


def _rewrite_optim(path: Path, edit) -> None:
    from ds_checkpoint._deepspeed_import import safe_torch_load

    loaded = safe_torch_load(path)
    loaded["optimizer_state_dict"]["loss_scaler"] = None  # a stand-in object would not re-load
    edit(loaded["optimizer_state_dict"])
    torch.save(loaded, path)


def _copy(tmp_path: Path, name: str) -> tuple[Path, Path]:
    shutil.copytree(FIXTURES / "zero3_fp32" / "ckpt", tmp_path / name)
    return tmp_path / name, tmp_path / name / "global_step3"


def test_zero3_tampered_and_truncated_files_are_named(tmp_path):
    ds, tag = _copy(tmp_path, "uneven")
    _rewrite_optim(
        tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt",
        lambda osd: osd["fp32_flat_groups"].__setitem__(0, osd["fp32_flat_groups"][0][:10]),
    )
    with pytest.raises(CheckpointCorruptError, match="global_step3 group 0: the ranks' partitions differ"):
        load_deepspeed(ds)
    ds, tag = _copy(tmp_path, "short")
    for r in range(2):  # both short: a parameter would read past the end
        _rewrite_optim(
            tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt",
            lambda osd: osd["fp32_flat_groups"].__setitem__(1, osd["fp32_flat_groups"][1][:9]),
        )
    with pytest.raises(CheckpointCorruptError, match="end before parameter '5.bias'"):
        load_deepspeed(ds)
    ds, tag = _copy(tmp_path, "truncated")
    optim = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    optim.write_bytes(optim.read_bytes()[:1000])
    with pytest.raises(CheckpointCorruptError, match="zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        load_deepspeed(ds)
    optim.unlink()
    with pytest.raises(CheckpointNotFoundError, match="zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        load_deepspeed(ds)


def test_zero3_unlisted_class_is_refused(tmp_path, capsys):
    ds, tag = _copy(tmp_path, "evil")
    optim = tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    _rewrite_optim(optim, lambda osd: osd.__setitem__("evil", Evil()))
    with pytest.raises(DeepSpeedImportError, match="zero_pp_rank_0_mp_rank_00_optim_states.pt: refused"):
        load_deepspeed(ds)
    assert "pwned" not in capsys.readouterr().out


def test_zero3_converted_checkpoint_loads_and_exports(tmp_path):
    ckpt = _load("zero3_fp32")
    assert ckpt.zero_stage == 3 and ckpt.world_size == 2
    ckpt.save(tmp_path, "global_step3")
    export_fp32(tmp_path, tmp_path / "w.safetensors")
    expected = load_file(FIXTURES / "zero3_fp32" / "expected.safetensors")
    weights = load_file(tmp_path / "w.safetensors")
    for name in ("0.weight", "0.bias", "3.weight", "5.weight", "7.bias"):
        assert torch.equal(weights[name], expected[f"zero_to_fp32.{name}"]), name


def test_zero3_frozen_parameters_are_refused_by_name(tmp_path):
    from ds_checkpoint._deepspeed_import import safe_torch_load

    ds, tag = _copy(tmp_path, "frozen")
    model_file = tag / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    model = safe_torch_load(model_file)
    model["frozen_param_shapes"] = {"9.weight": torch.Size([2, 2])}
    torch.save(model, model_file)
    with pytest.raises(DeepSpeedImportError, match=r"frozen .*\['9.weight'\]"):
        load_deepspeed(ds)


def test_zero3_buffers_that_differ_by_rank_are_reported(tmp_path):
    from ds_checkpoint._deepspeed_import import safe_torch_load

    ds, tag = _copy(tmp_path, "buffers")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fixture's ranks agree: no warning
        load_deepspeed(ds)
    model_file = tag / "zero_pp_rank_1_mp_rank_00_model_states.pt"
    model = safe_torch_load(model_file)
    model["module"]["1.running_mean"] += 1
    torch.save(model, model_file)
    with pytest.warns(UserWarning, match=r"different values for buffers \['1.running_mean'\].*rank 0's"):
        ckpt = load_deepspeed(ds)
    expected = load_file(FIXTURES / "zero3_fp32" / "expected.safetensors")
    assert torch.equal(ckpt.model_state["1.running_mean"], expected["module.1.running_mean"])
