"""DeepSpeed-style scripts run unmodified on ds's ``deepspeed`` package (``import deepspeed`` untouched), at 2
ranks, under ds-launch, torchrun and DeepSpeed's own ``deepspeed`` command (ds's package); their losses match
DeepSpeed 0.19.8's (recorded by ``tools/fixtures/make_deepspeed_dropin_fixtures.py`` from the same scripts).

Scripts (integration/scripts/dropin/): an image classifier in the 2020 style and in the current style
(``deepspeed.accelerator``, ``deepspeed.comm``, ``deepspeed.utils``, a config with DeepSpeed's defaults spelled
out), a two-engine GAN, a Hugging Face masked LM (skipped without ``transformers``), and a checkpoint saved into
a per-rank timestamped folder. They run only in the 2-rank session: their data split is fixed at 2 ranks, and
other world sizes would only repeat them (CI time).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HERE, launch, world_size

SCRIPTS = HERE / "scripts" / "dropin"
FIXTURES = HERE / "fixtures" / "deepspeed_dropin"
pytestmark = pytest.mark.skipif(world_size() != 2, reason="the drop-in scripts are compared at 2 ranks only")


def unmodified(script: str) -> Path:
    """The script itself, unmodified: ``import deepspeed`` resolves to ds's ``deepspeed`` package."""
    import deepspeed

    assert deepspeed.IMPLEMENTATION.startswith("ds "), deepspeed.__file__  # not a real DeepSpeed
    path = SCRIPTS / script
    assert "import deepspeed\n" in path.read_text()
    return path


def torchrun(script: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    cmd = [exe, "--standalone", "--nproc_per_node", "2", str(script), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def deepspeed_command(script: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """DeepSpeed's own command line, ``deepspeed --num_gpus 2 script args`` (on CPU: 2 processes)."""
    found = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    exe = [found] if found else [sys.executable, "-m", "deepspeed.launcher.runner"]
    cmd = [*exe, "--num_gpus", "2", str(script), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def run(
    launcher: str, script: Path, record: dict, out: Path, tmp_path: Path, config: dict | None = None
) -> list:
    return run_all(launcher, script, record, out, tmp_path, config)["losses"]


def run_all(
    launcher: str, script: Path, record: dict, out: Path, tmp_path: Path, config: dict | None = None
) -> dict:
    """Everything the script wrote (``{tmp}`` in the recorded arguments: a new folder under ``tmp_path``)."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    args = [a.replace("{tmp}", str(tmp_path / "tmp")) for a in record["args"]] + ["--out", str(out)]
    config = config if config is not None else record["config"]
    if config is not None:
        (tmp_path / "ds_config.json").write_text(json.dumps(config))
        args += ["--deepspeed_config", str(tmp_path / "ds_config.json")]
    if launcher == "torchrun":
        torchrun(script, *args)
    elif launcher == "deepspeed":
        deepspeed_command(script, *args)
    else:
        launch(str(script), *args, num_procs=2)
    return json.loads(out.read_text())


# each fixture under one launcher; together they cover both launchers, ZeRO 0/1/2, fp32 and bf16
# (current_zero0_fp32.json is recorded too; c2020 and the GAN cover stage 0, CI time)
CASES = {
    "current_zero1_bf16": "torchrun",
    "current_zero2_fp32": "deepspeed",  # the deepspeed command, the script unchanged
    "c2020_zero0_fp32": "torchrun",
    "c2020_zero2_bf16": "ds-launch",
    "gan_zero0_fp32": "torchrun",
    "bert_zero1_fp32": "ds-launch",
    "hello_bert_zero1_fp32": "torchrun",  # also compared after save_checkpoint / load_checkpoint
}
# bf16 rounds differently in DeepSpeed's and ds's optimizer wrappers; fp32 agrees to float precision
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}


@pytest.mark.parametrize(("name", "launcher"), CASES.items(), ids=list(CASES))
def test_losses_match_deepspeed(name: str, launcher: str, tmp_path: Path):
    fixture = FIXTURES / f"{name}.json"
    if name.startswith("bert_") and (
        not fixture.exists() or importlib.util.find_spec("transformers") is None
    ):
        pytest.skip("needs transformers (here and when the fixture was recorded)")
    record = json.loads(fixture.read_text())
    assert record["deepspeed_version"] == "0.19.8" and record["world_size"] == 2
    got = run_all(launcher, unmodified(record["script"]), record, tmp_path / "losses.json", tmp_path)
    limit = TOLERANCE[name.rsplit("_", 1)[1]]
    for key in ("losses", "resumed_losses"):  # resumed: a fresh engine after load_checkpoint
        if key not in record:
            continue
        ours, theirs = got[key], record[key]
        assert len(ours) == len(theirs) > 0
        worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs, strict=True))
        assert worst <= limit, (
            f"{name} {key}: max relative difference {worst:.2e}\nds:        {ours}\ndeepspeed: {theirs}"
        )
    if "client_state" in record:
        assert got["client_state"]["checkpoint_step"] == record["client_state"]["checkpoint_step"]


# stage 2 only: test_zero_outside_backward.py covers stages 1 and 2 of the same two-engine pattern
@pytest.mark.parametrize("stage", [2])
def test_gan_at_zero_stages_trains_as_at_stage0(stage: int, tmp_path: Path):
    """The generator's backward writes into the discriminator outside D's own backward: same result, or an error."""
    record = json.loads((FIXTURES / "gan_zero0_fp32.json").read_text())
    config = {**record["config"], "zero_optimization": {"stage": stage}}
    ours = run("ds-launch", unmodified(record["script"]), record, tmp_path / "losses.json", tmp_path, config)
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, record["losses"], strict=True))
    assert worst <= 1e-4, f"stage {stage}: max relative difference {worst:.2e} from DeepSpeed's stage 0"


def test_per_rank_timestamped_save_dirs_give_one_complete_checkpoint(tmp_path: Path):
    """Each rank names its own folder; ds writes every rank into rank 0's folder and says so once."""
    script = unmodified("timestamped_save.py")
    root = tmp_path / "checkpoints"
    root.mkdir()
    (tmp_path / "ds_config.json").write_text(
        json.dumps({"train_batch_size": 4, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}})
    )
    proc = launch(
        str(script), "--root", str(root), "--deepspeed_config", str(tmp_path / "ds_config.json"), num_procs=2
    )
    folders = list(root.iterdir())
    assert len(folders) == 1 and folders[0].name.startswith("run-"), folders  # nothing scattered
    shards = sorted(p.name for p in folders[0].glob("*/optim_rank*.json"))
    assert shards == ["optim_rank00000.json", "optim_rank00001.json"]  # both ranks' shards, one place
    warned = [line for line in (proc.stdout + proc.stderr).splitlines() if "different save_dirs" in line]
    assert warned and str(folders[0]) in warned[0], proc.stderr[-3000:]
