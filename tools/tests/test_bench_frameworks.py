"""tools/bench/bench_frameworks.py's arithmetic and table on canned numbers (no framework is launched)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "bench"))
import bench_frameworks as bf  # noqa: E402


def test_step_time_is_the_median_after_warmup() -> None:
    assert bf.step_time([9.0, 9.0, 0.3, 0.1, 0.2], warmup=2) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        bf.step_time([0.1, 0.2], warmup=2)


def test_parse_reads_each_scripts_records() -> None:
    # Trainer/Accelerate: a record per step, then step_seconds; a launcher prefix and other lines are skipped
    stdout = "\n".join(
        [
            "[rank0]: starting",
            '{"step": 1, "loss": 2.0}',
            'prefix {"step": 2, "loss": 1.5, "grad_norm": null}',
            '{"weights": {"a": 1.0}}',
            '{"step_seconds": [0.1, 0.2]}',
        ]
    )
    assert bf.parse(bf.records(stdout)) == ([0.1, 0.2], [2.0, 1.5])
    # Lightning: one final record with both
    lightning = json.dumps({"steps": [0, 1], "losses": [3.0, 2.5], "step_seconds": [0.5, 0.4]})
    assert bf.parse(bf.records(lightning)) == ([0.5, 0.4], [3.0, 2.5])
    with pytest.raises(ValueError):
        bf.parse(bf.records('{"step": 1, "loss": 2.0}'))


def test_max_rel_diff_over_the_first_steps() -> None:
    assert bf.max_rel_diff([1.0, 2.2, 99.0], [1.0, 2.0, 3.0], steps=2) == pytest.approx(0.1)
    assert bf.max_rel_diff([1.0], [1.0, 2.0], steps=2) == float("inf")  # a short run never passes


def test_script_args_per_setup() -> None:
    assert bf.script_args("ddp", None, 40, 256, 4) == [
        "--steps",
        "40",
        "--width",
        "256",
        "--layers",
        "4",
        "--ddp",
    ]
    assert bf.script_args("ds", 3, 40, 512, None) == ["--steps", "40", "--width", "512", "--stage", "3"]


def test_sizes_overrides() -> None:
    size = bf.sizes(["trainer=128x2", "lightning=64", "accelerate=2048"])
    assert size["trainer"] == (128, 2) and size["lightning"] == (64, None)
    assert size["accelerate"] == (2048, bf.FRAMEWORKS["accelerate"].layers)
    for bad in ["lightning=64x2", "nope=1", "trainer="]:
        with pytest.raises(SystemExit):
            bf.sizes([bad])


def test_overhead_is_step_time_minus_the_frameworks_ddp_and_mismatches_are_reported() -> None:
    best = {
        ("trainer", "ddp", None): 0.100,
        ("trainer", "deepspeed", 2): 0.130,
        ("trainer", "ds", 2): 0.110,
        ("lightning", "ddp", None): 0.050,
        ("lightning", "deepspeed", 2): 0.080,
        ("lightning", "ds", 2): 0.060,
    }
    losses = {key: [2.0, 1.0, 0.5] for key in best}
    losses[("lightning", "ds", 2)] = [2.0, 1.1, 0.5]  # 10% off at step 2
    table_rows = bf.rows(best, losses, ["trainer", "lightning"], [2], check_steps=3)
    text = bf.table(table_rows, check_steps=3, loss_tol=1e-3)
    lines = text.splitlines()
    assert lines[2] == "| HF Trainer | 2 | 100.00 | 130.00 | 30.00 | 110.00 | 10.00 | 0.0e+00 | 0.0e+00 |"
    assert lines[3].startswith(
        "| Lightning | 2 | 50.00 | 80.00 | 30.00 | 60.00 | 10.00 | 1.0e-01 **differs** |"
    )
    notes = text.split("\n\n", 1)[1].splitlines()
    assert len(notes) == 1 and notes[0].startswith("ds and DeepSpeed train differently: Lightning ZeRO 2")
    losses[("trainer", "ddp", None)] = [2.0, 1.0, 0.7]  # a baseline that does other work is reported too
    text = bf.table(bf.rows(best, losses, ["trainer"], [2], check_steps=3), check_steps=3, loss_tol=1e-3)
    assert text.endswith(
        "the DDP baseline and DeepSpeed train differently: HF Trainer ZeRO 2, losses of the "
        "first 3 steps differ by up to 4.0e-01 relative (tolerance 1e-03)"
    )
