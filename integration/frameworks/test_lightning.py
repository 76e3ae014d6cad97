"""Lightning, unmodified, on ds's ``deepspeed`` at 2 ranks through Lightning's own launcher.

Step losses equal DeepSpeed 0.19.8's (fixtures/lightning.json, recorded by tools/fixtures/make_framework_fixtures.py),
also under Lightning's registered ``deepspeed_stage_3_offload_nvme`` (where ds is seen to write the optimizer
state under nvme_path);
Lightning checkpoints (ModelCheckpoint, ``trainer.save_checkpoint``) resume to the same losses as an
uninterrupted run at 1 and 4 ranks from a 2-rank checkpoint (beyond DeepSpeed: ds reshards), and the
files hold no pickle. Each launched run is shared through module-scoped fixtures (a Lightning run costs
seconds of imports per rank).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning", reason="the frameworks session installs lightning (noxfile.py FRAMEWORKS)")

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "lightning_script.py"
FIXTURE = json.loads((HERE / "fixtures" / "lightning.json").read_text())["cases"]
RTOL = 1e-5
CKPT_STEP = 3  # ModelCheckpoint saves after this many optimizer steps (the end of epoch 0)


# Lightning's MPIEnvironment.detect() imports mpi4py.MPI in every process where mpi4py is installed (the
# frameworks session has it), which initialises Open MPI as a singleton; Open MPI 5's shared-memory BTL
# then leaves a 16 MiB /dev/shm/sm_segment.<host>.0.<job>0000.0 behind per process, finalized or not (a
# job under mpirun has its daemon unlink it). A singleton talks to no one: only the "self" BTL is needed.
ENV = {"PYTHONWARNINGS": "ignore", "OMPI_MCA_btl": "self"}


def launch(args: list[str], cwd: Path) -> dict:
    """Run the Lightning script (Lightning starts the other ranks); rank 0's JSON result."""
    env = dict(os.environ, **ENV)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"lightning_script.py {' '.join(args)} failed:\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_close(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} steps, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= RTOL * abs(w), (
            f"{what}: step {i} loss {g!r} != {w!r} (rtol {RTOL})\n{got}\n{want}"
        )


@pytest.fixture(scope="module")
def zero3_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """ZeRO-3 at 2 ranks with ModelCheckpoint every CKPT_STEP steps and a final trainer.save_checkpoint."""
    d = tmp_path_factory.mktemp("lightning_zero3")
    args = [*FIXTURE["lightning_zero3"]["args"], "--save-dir", "ckpts", "--every", str(CKPT_STEP)]
    result = launch([*args, "--final-ckpt", "final.ckpt"], d)
    return result, d


@pytest.mark.parametrize(
    "case", ["lightning_zero0", "lightning_zero1_bf16", "lightning_zero2", "lightning_stage_3_offload_nvme"]
)
def test_losses_equal_deepspeeds(case: str, tmp_path: Path) -> None:
    result = launch(FIXTURE[case]["args"], tmp_path)
    assert result["world_size"] == 2
    assert_close(result["losses"], FIXTURE[case]["losses"], f"{case} ds vs DeepSpeed 0.19.8")
    if case == "lightning_stage_3_offload_nvme":
        assert_optimizer_state_on_disk(tmp_path / "nvme", ranks=2)


def assert_optimizer_state_on_disk(nvme_path: Path, ranks: int) -> None:
    """Under ``deepspeed_stage_3_offload_nvme`` ds wrote each rank's optimizer state (fp32 masters, exp_avg,
    exp_avg_sq: three fp32 copies of the model, less 1% for bytes of a value that happen to be zero) into files
    under nvme_path. The parameters stay in memory: Lightning's defaults keep up to ``max_in_cpu`` 1e9
    elements there, and the default ``stage3_param_persistence_threshold`` (1e5) leaves this model's small
    parameters whole on every rank. DeepSpeed itself wrote no file for this model (it swaps only tensors of
    1 MiB and more; tools/fixtures/make_framework_fixtures.py), so the fixture holds its losses, not its I/O."""
    import importlib.util

    from launch import swap_files

    spec = importlib.util.spec_from_file_location("lightning_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    numel = sum(p.numel() for p in script.Regressor().parameters())
    found = swap_files(nvme_path)
    written = {f"rank{r:05d}": 0 for r in range(ranks)}
    for name, seen in found.items():
        if not name.startswith("ds_swap_params/"):
            written[Path(name).parent.name] += seen["nonzero"]
    assert all(written.values()), f"a rank wrote no optimizer state under {nvme_path}: {found}"
    assert sum(written.values()) >= 0.99 * 3 * 4 * numel, (written, numel, found)


def test_zero3_losses_equal_deepspeeds(zero3_run: tuple[dict, Path]) -> None:
    result, _ = zero3_run
    assert_close(result["losses"], FIXTURE["lightning_zero3"]["losses"], "ZeRO-3 ds vs DeepSpeed 0.19.8")


@pytest.mark.parametrize("devices", [1, 4])
def test_resume_continues_identically(devices: int, zero3_run: tuple[dict, Path]) -> None:
    """Resume (``ckpt_path=``) the 2-rank ModelCheckpoint at 1 and 4 ranks: the losses after resuming equal
    the uninterrupted run's (DeepSpeed itself cannot load a ZeRO checkpoint at another rank count). Lightning
    takes the same load path at any rank count; the same-size resume is the Trainer's and Accelerate's test
    (CI time)."""
    full, d = zero3_run
    ckpt = d / "ckpts" / f"epoch=0-step={CKPT_STEP}.ckpt"
    assert ckpt.is_dir(), sorted(p.name for p in (d / "ckpts").iterdir())
    args = ["--stage", "3", "--devices", str(devices), "--steps", "6", "--resume", str(ckpt)]
    resumed = launch(args, d)
    assert resumed["world_size"] == devices
    assert resumed["steps"] == full["steps"][CKPT_STEP:]
    assert_close(
        resumed["losses"], full["losses"][CKPT_STEP:], f"resumed at {devices} ranks vs uninterrupted"
    )


def test_checkpoint_files_hold_no_pickle(zero3_run: tuple[dict, Path]) -> None:
    """Everything the Lightning saves wrote is JSON, plain text or safetensors (no pickle to execute)."""
    from safetensors.torch import load_file

    _, d = zero3_run
    files = [p for p in d.rglob("*") if p.is_file() and ("ckpts" in p.parts or "final.ckpt" in p.parts)]
    assert any(p.suffix == ".safetensors" for p in files) and any(p.name == "latest" for p in files)
    for p in files:
        if p.suffix == ".safetensors":
            load_file(str(p))
        elif p.suffix == ".json":
            json.loads(p.read_text())
        else:
            assert p.name == "latest", f"unexpected file kind {p}"
            p.read_text()


def test_convert_zero_checkpoint_gives_the_trained_weights(
    zero3_run: tuple[dict, Path], tmp_path: Path
) -> None:
    """Lightning's converter on the 2-rank ZeRO-3 checkpoint after CKPT_STEP steps: those weights give, on the
    batch of step CKPT_STEP, the loss the run logged there; the file loads with ``weights_only=True``."""
    import importlib.util

    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    full, d = zero3_run
    out = tmp_path / "lightning_model.pt"
    convert_zero_checkpoint_to_fp32_state_dict(d / "ckpts" / f"epoch=0-step={CKPT_STEP}.ckpt", out)
    saved = torch.load(out, weights_only=True)
    assert saved["global_step"] == CKPT_STEP

    spec = importlib.util.spec_from_file_location("lightning_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    model = script.Regressor()
    model.load_state_dict(saved["state_dict"])
    data = script.dataset()
    x, y = data.tensors
    # step 3 opens epoch 1 (3 steps an epoch); Lightning's DistributedSampler shuffles (seed 0, set_epoch), and
    # the global batch is every rank's first micro-batch of that epoch
    batch = []
    for rank in range(2):
        sampler = torch.utils.data.DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(1)
        batch += list(sampler)[: script.GLOBAL_BATCH // 2]
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch]).item()
    assert abs(loss - full["losses"][CKPT_STEP]) <= 1e-5 * full["losses"][CKPT_STEP], (loss, full["losses"])


def _singleton_segments() -> set[str]:
    host = os.uname().nodename
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"sm_segment.{host}.") and n.endswith("0000.0")}


def test_lightnings_mpi_detection_leaves_no_shared_memory_segment() -> None:
    """What each Lightning process above does at start (MPIEnvironment.detect()), in the same environment:
    no segment is left in /dev/shm (without OMPI_MCA_btl=self: one 16 MiB file per process)."""
    pytest.importorskip("mpi4py")
    before = _singleton_segments()
    detect = "from lightning.fabric.plugins.environments import MPIEnvironment as E; print(E.detect())"
    proc = subprocess.run([sys.executable, "-c", detect], env=dict(os.environ, **ENV), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.stdout.strip() == "False", proc.stderr[-3000:]  # it ran, and is no MPI job
    left = _singleton_segments() - before
    for name in left:  # not ours to keep either way
        Path("/dev/shm", name).unlink(missing_ok=True)
    assert not left, f"Open MPI's singleton left {sorted(left)} in /dev/shm"
