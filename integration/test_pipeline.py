"""A GPT-NeoX-style pipeline script written for DeepSpeed (integration/scripts/pipe/gpt_neox_pipe.py: tied
embeddings through TiedLayerSpec, LayerSpecs, loss_fn, train_batch over a data iterator) runs unchanged on
ds's ``deepspeed`` package, and its losses equal DeepSpeed 0.19.8's (recorded at 2 ranks, 2 stages, by
``tools/fixtures/make_deepspeed_pipe_fixtures.py --losses``). At 2 ranks under DeepSpeed's own command line
(ds's); at 4 ranks under ds-launch as 2 stages x 2 data-parallel ranks and as 4 stages: the script reads
each step's micro-batches by ``engine.grid``, so the layout must not change the losses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import HERE, launch, world_size

SCRIPT = HERE / "scripts" / "pipe" / "gpt_neox_pipe.py"
FIXTURES = HERE / "fixtures" / "deepspeed_pipe"
CASES = ["neox_2stages_fp32", "neox_2stages_zero1_fp32"]
LAYOUTS = {2: [2], 4: [2, 4]}.get(world_size(), [])  # pipeline stages run at this world size


def _run(stages: int, record: dict, tmp_path: Path, *extra: str) -> dict:
    from test_dropin import deepspeed_command

    cfg, out = tmp_path / "ds_config.json", tmp_path / "losses.json"
    cfg.write_text(json.dumps(record["config"]))
    args = [
        "--stages",
        str(stages),
        "--steps",
        str(record["steps"]),
        "--out",
        str(out),
        "--deepspeed_config",
        str(cfg),
        *extra,
    ]
    if world_size() == 2:
        deepspeed_command(SCRIPT, *args)  # DeepSpeed's launcher command line, ds's package
    else:
        launch(str(SCRIPT), *args, num_procs=world_size())
    return json.loads(out.read_text())


@pytest.mark.skipif(not LAYOUTS, reason="the pipeline script runs at 2 and 4 ranks")
@pytest.mark.parametrize("stages", LAYOUTS)
@pytest.mark.parametrize("case", CASES)
def test_losses_equal_deepspeed_pipeline_engine(case: str, stages: int, tmp_path: Path):
    record = json.loads((FIXTURES / f"{case}.json").read_text())
    assert record["deepspeed_version"] == "0.19.8"
    got = _run(stages, record, tmp_path)
    assert got["losses"] == pytest.approx(record["losses"], rel=1e-5)
    if stages == 2:
        assert got["parts"] == record["parts"]  # the same layers on each stage ("parameters" partition)


@pytest.mark.skipif(not LAYOUTS, reason="the pipeline script runs at 2 and 4 ranks")
def test_deepspeed_pipeline_checkpoint_weights_load(tmp_path: Path):
    """DeepSpeed 0.19.8's checkpoint of the script after 4 steps (its layer_XX-model_states.pt files, read by
    ds_checkpoint's restricted unpickler) loads at another degree than DeepSpeed's 2 stages: as the plain model
    (one stage, 2 data-parallel ranks) at 2 ranks, at 4 stages at 4 ranks; the loss of step 5 is DeepSpeed's."""
    record = json.loads((FIXTURES / "neox_2stages_fp32.json").read_text())
    ckpt = FIXTURES / "ckpt_neox_2stages_step4"
    got = _run(
        {2: 1, 4: 4}[world_size()],
        record,
        tmp_path,
        "--load_dir",
        str(ckpt),
        "--start_step",
        "4",
        "--steps",
        "5",
    )
    assert got["losses"][0] == pytest.approx(record["losses"][4], rel=1e-5)


@pytest.mark.skipif(world_size() != 2, reason="one 2-rank job is enough to see a dead stage end it")
def test_a_dead_stage_ends_the_job_within_a_minute_naming_it():
    import os
    import shutil
    import subprocess
    import sys
    import time

    found = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    exe = [found] if found else [sys.executable, "-m", "deepspeed.launcher.runner"]
    start = time.monotonic()
    proc = subprocess.run(
        [*exe, "--num_gpus", "2", str(HERE / "scripts" / "pipe" / "stage_dies.py"), "--stages", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
    )
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert elapsed < 60 + 30, elapsed  # a minute after the death, plus the job's start on a loaded machine
    assert "stage 0: stage 1 (rank 1) failed or died" in out, out[-3000:]  # the survivor names the dead stage
