"""A script written for DeepSpeed runs unchanged on ds (its ``import deepspeed`` is ds's deepspeed package),
and its losses match DeepSpeed's.

The DeepSpeed losses were recorded from the real ``deepspeed`` 0.19.8 on CPU (2 ranks, same script, same
config, and stage 3 with NVMe optimizer offload, and with parameters and optimizer on NVMe) by ``tools/fixtures/make_deepspeed_loss_fixtures.py``; ds runs here at the session's world size, which must
not matter because every rank takes its slice of the same global batch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import HERE, launch, world_size

FIXTURES = sorted((HERE / "fixtures" / "deepspeed_losses").glob("*.json"))
ORIGINAL = HERE / "scripts" / "deepspeed_example.py"


@pytest.fixture(scope="module")
def ds_script() -> Path:
    """The DeepSpeed script itself: nothing changed, ds answers its ``import deepspeed``."""
    assert "\nimport deepspeed\n" in ORIGINAL.read_text()
    return ORIGINAL


def test_fixtures_cover_every_zero_stage():
    names = [f"zero{s}_fp32_adam_warmuplr.json" for s in (0, 1, 2, 3)]
    nvme = ["zero3_fp32_adam_warmuplr_nvme.json", "zero3_fp32_adam_warmuplr_nvme_params.json"]
    assert [f.name for f in FIXTURES] == sorted([*names, *nvme])


# every stage is compared at 2 ranks, where the fixtures were recorded; at 1 and 4 ranks only the stage that
# partitions most is re-checked: world-size independence of every stage is test_engine_parity's job (it
# runs every stage at every world size), and each extra launch costs CI 10-20 s; parameters on NVMe are
# re-checked at 4 ranks, where each rank's pieces differ most, not at 1
AT_THIS_WORLD_SIZE = (
    FIXTURES
    if world_size() == 2
    else [
        f
        for f in FIXTURES
        if f.stem.startswith("zero3") and (world_size() > 2 or not f.stem.endswith("nvme_params"))
    ]
)


@pytest.mark.parametrize("fixture", AT_THIS_WORLD_SIZE, ids=lambda p: p.stem)
def test_loss_curve_matches_deepspeed(fixture: Path, ds_script: Path, tmp_path: Path):
    recorded = json.loads(fixture.read_text())
    assert recorded["deepspeed_version"] == "0.19.8"
    config = tmp_path / "ds_config.json"
    nvme = tmp_path / "nvme"  # the NVMe offload fixture's nvme_path (a placeholder in the recording)
    nvme.mkdir()
    config.write_text(json.dumps(recorded["config"]).replace("@NVME_PATH@", str(nvme)))
    out = tmp_path / "losses.json"
    launch(
        str(ds_script),
        "--deepspeed_config",
        str(config),
        "--out",
        str(out),
        "--steps",
        str(len(recorded["losses"])),
    )
    ours = json.loads(out.read_text())["losses"]
    theirs = recorded["losses"]
    assert len(ours) == len(theirs) == 20
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    assert worst <= 1e-4, (
        f"{fixture.stem}: max relative difference {worst:.2e}\nds:        {ours}\ndeepspeed: {theirs}"
    )
    assert theirs[-1] < theirs[0], "the recorded run should learn"
    if "offload_param" in recorded["config"]["zero_optimization"]:  # the parameters really were on disk
        pieces = sorted(nvme.glob("ds_swap_params/rank*/g*.param.bin"))
        assert len(pieces) == world_size() and all(p.stat().st_size > 0 for p in pieces), pieces


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
