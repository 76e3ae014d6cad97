"""Hugging Face Trainer, unmodified, on ds's ``deepspeed`` at 2 ranks (torchrun, and ZeRO 0 under DeepSpeed's
``deepspeed`` command; gloo, CPU).

Against DeepSpeed 0.19.8's run of the same script (fixtures/trainer.json, recorded by
tools/fixtures/make_framework_fixtures.py): step losses at ZeRO 0, 2 (with the optimizer offloaded to the CPU, which
builds DeepSpeed's CPU Adam as DeepSpeed does) and 3; at ZeRO 3 the weights ``save_model`` writes; ZeRO 3 with
the parameters and the optimizer on ``nvme`` (ZeRO-Infinity), whose state ds is seen to write under nvme_path. Beyond DeepSpeed: a 2-rank checkpoint resumes identically at 2, 1 and 4 ranks (the global batch
kept at 4), and the checkpoint files ds writes hold no pickle.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from launch import HERE, assert_swapped_to_disk, losses, run_script, weights

pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

FIXTURE = json.loads((HERE / "fixtures" / "trainer.json").read_text())
SCRIPT = "trainer_script.py"
REL_TOL = 1e-5
# the sums of tensors that hold attention's key bias, whose updates are rounding's (test_zero3_save_model_...)
KEY_BIAS_ABS_TOL = 1e-4
GLOBAL_BATCH = 4


def _run(*args: str, nproc: int = 2, launcher: list[str] | None = None) -> list[dict]:
    return run_script(sys.executable, SCRIPT, *args, nproc=nproc, launcher=launcher)


def deepspeed_command(nproc: int) -> list[str]:
    """DeepSpeed's ``deepspeed --num_gpus N`` (ds's package; on CPU, N processes); the script takes no
    ``--local_rank`` argument, as a Trainer script reading LOCAL_RANK from the environment need not."""
    found = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    exe = [found] if found else [sys.executable, "-m", "deepspeed.launcher.runner"]
    return [*exe, "--num_gpus", str(nproc), "--no_local_rank"]


def assert_close(ours: list[float], theirs: list[float], what: str) -> None:
    assert len(ours) == len(theirs) and theirs, f"{what}: ds {ours}, expected {theirs}"
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    assert worst <= REL_TOL, (
        f"{what}: max relative difference {worst:.2e}\nds:       {ours}\nexpected: {theirs}"
    )


@pytest.fixture(scope="module")
def zero3_run(tmp_path_factory) -> tuple[list[dict], Path]:
    """One ZeRO-3 run serves the losses, the saved weights and the checkpoint the resume tests start from."""
    out = tmp_path_factory.mktemp("trainer-zero3")
    case = FIXTURE["cases"]["zero3"]
    return _run(*case["args"], "--save-steps", "2", "--out", str(out)), out


def test_fixture_is_deepspeed_0198():
    assert FIXTURE["deepspeed_version"] == "0.19.8"
    # the sequence-parallel cases (sp2_*) are test_trainer_sp.py's
    assert set(FIXTURE["cases"]) == {
        "zero0",
        "zero2_offload",
        "zero3",
        "zero3_nvme",
        "sp2_zero2",
        "sp2_zero3",
    }


@pytest.mark.parametrize("case", ["zero0", "zero2_offload", "zero3_nvme"])
def test_losses_match_deepspeed(case, tmp_path):
    recorded = FIXTURE["cases"][case]
    # zero0 under DeepSpeed's own `deepspeed` command, the others under torchrun
    launcher = deepspeed_command(recorded["ranks"]) if case == "zero0" else None
    records = _run(*recorded["args"], "--out", str(tmp_path), nproc=recorded["ranks"], launcher=launcher)
    assert_close(losses(records), recorded["losses"], f"Trainer {case}")
    if case == "zero3_nvme":  # ZeRO-Infinity: the same losses, with the state in files under nvme_path
        numel = next(r["numel"] for r in records if "numel" in r)
        assert_swapped_to_disk(tmp_path / "nvme", numel, recorded["ranks"])
        return
    # DeepSpeed's fp32 stage-0 engine reports no gradient norm; the Trainer logs one only where it does
    assert all((r["grad_norm"] is not None) == (case != "zero0") for r in records if "step" in r)
    if (
        case == "zero2_offload"
    ):  # the optimizer the engine built from the config is DeepSpeed's CPU Adam, as in
        built = [r["optimizer"] for r in records if "optimizer" in r]  # DeepSpeed's run: offload took effect
        assert built == [recorded["optimizer"]] == ["DeepSpeedCPUAdam"], (built, recorded.get("optimizer"))


def test_zero3_losses_match_deepspeed(zero3_run):
    assert_close(losses(zero3_run[0]), FIXTURE["cases"]["zero3"]["losses"], "Trainer zero3")


def test_zero3_save_model_writes_deepspeeds_weights(zero3_run):
    ours, theirs = weights(zero3_run[0]), FIXTURE["cases"]["zero3"]["weights"]
    assert ours is not None and ours.keys() == theirs.keys()
    # Per-tensor sums, each within 1e-5 (100x below what one Adam step moves one element at lr 1e-3), except
    # the tensors holding attention's key bias (GPT-2's c_attn.bias: query, key, value biases in one). The key
    # bias's exact gradient is zero (softmax ignores a constant added to every key's score), so what it gets
    # is rounding, whose sign depends on the order the CPU's vector units sum in; Adam divides it by its own
    # RMS, so each of its elements moves by up to ~lr a step either way. Its sum differs by ~1e-6 between
    # runs on one CPU and by 1.4e-5 between the recording's CPU and an AVX-512/AMX one: those tensors get
    # 1e-4, still 10x below one element's move in one step, so a wrong update of any element is caught.
    for name in theirs:
        tol = KEY_BIAS_ABS_TOL if name.endswith("attn.c_attn.bias") else 1e-5
        assert ours[name] == pytest.approx(theirs[name], rel=REL_TOL, abs=tol), name


def test_checkpoint_files_hold_no_pickle(zero3_run):
    """What ds writes for the Trainer's checkpoint (the global_step folder) is safetensors and JSON."""
    step_dir = zero3_run[1] / "checkpoint-2" / "global_step2"
    files = sorted(p for p in step_dir.rglob("*") if p.is_file())
    assert files, f"no checkpoint files under {step_dir}"
    for path in files:
        assert path.suffix in (".safetensors", ".json"), f"{path.name}: not safetensors or JSON"
        if path.suffix == ".json":
            json.loads(path.read_text())
        else:  # loads without unpickling anything
            assert all(isinstance(t, torch.Tensor) for t in load_file(path).values())


@pytest.mark.parametrize("nproc", [2, 1, 4])
def test_resume_continues_identically(zero3_run, nproc, tmp_path):
    """A 2-rank checkpoint at step 2 resumed at ``nproc`` ranks (same global batch) gives the uninterrupted
    run's losses for steps 3 and 4. DeepSpeed itself resumes only at the world size that saved."""
    uninterrupted = losses(zero3_run[0])
    records = _run(
        *FIXTURE["cases"]["zero3"]["args"][:2],
        "--batch", str(GLOBAL_BATCH // nproc),
        "--resume", str(zero3_run[1] / "checkpoint-2"),
        "--out", str(tmp_path),
        nproc=nproc,
    )  # fmt: skip
    assert [r["step"] for r in records if "loss" in r and "step" in r] == [3, 4]
    assert_close(losses(records), uninterrupted[2:], f"resume at {nproc} ranks")
