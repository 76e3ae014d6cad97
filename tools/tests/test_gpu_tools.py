"""The GPU checks' own plumbing, on CPU: gpu_engine_check's FSDP2 rows, profile_zero_gpu's report and
gpu_multirank_check's two-rank run and comparison (run in the integration session, which has torch)."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the GPU tools' tests run in the integration session")

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools" / "gpu"), str(ROOT / "tools" / "bench")]
import gpu_multirank_check  # noqa: E402


def _run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    src = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*src, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )


@pytest.mark.timeout(420)
def test_engine_check_runs_fsdp2_beside_ds_on_cpu(tmp_path: Path) -> None:
    """FSDP2 in fp32 is the same model, optimizer and batches as the reference: its losses equal them."""
    out = tmp_path / "e.json"
    cases = "stage 3 bf16,FSDP2 fp32,FSDP2 bf16"
    argv = ["--device", "cpu", "--model", "tiny", "--steps", "1", "--warmup", "1", "--cases", cases]
    proc = _run(tmp_path, str(ROOT / "tools/gpu/gpu_engine_check.py"), *argv, "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["FSDP2 fp32"]["max_rel_loss_diff_vs_reference"] < 1e-6
    assert rows["FSDP2 bf16"]["max_rel_loss_diff_vs_reference"] > 0  # it did compute in bf16
    assert rows["FSDP2 bf16"]["model_params_on"] == ["cpu"] and rows["FSDP2 bf16"]["step_ms"] > 0


@pytest.mark.timeout(420)
def test_profile_writes_phases_ops_and_python_tables(tmp_path: Path) -> None:
    out = tmp_path / "p.txt"
    argv = ["--device", "cpu", "--model", "tiny", "--steps", "1", "--warmup", "1", "--rows", "5"]
    proc = _run(
        tmp_path,
        str(ROOT / "tools/gpu/profile_zero_gpu.py"),
        *argv,
        "--cases",
        "stage 3 bf16",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    for needle in (
        "## stage 3 bf16: median step",
        "phase/forward",
        "phase/backward",
        "phase/step",
        "aten::",
        "tottime",
    ):
        assert needle in text, needle


@pytest.mark.timeout(420)
def test_multirank_check_runs_two_ranks_and_compares(tmp_path: Path) -> None:
    """Both sides on CPU: two ranks train on different batches (their losses differ) and match exactly."""
    out = tmp_path / "m.json"
    argv = ["--device", "cpu", "--model", "tiny", "--steps", "2", "--cases", "gloo isend/irecv,stage 2 fp32"]
    proc = _run(tmp_path, str(ROOT / "tools/gpu/gpu_multirank_check.py"), *argv, "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    assert all(r["ok"] for r in rows.values())
    dev = rows["stage 2 fp32"]["device"]
    assert dev[0]["losses"] != dev[1]["losses"] and dev[0]["backend"] == "gloo"
    assert rows["gloo isend/irecv"]["device"][0]["losses"] == [10.0, 11.0, 12.0, 13.0]  # rank 1's tensor


def test_multirank_compare_flags_a_difference_and_a_failure() -> None:
    args = argparse.Namespace(rtol=1e-4, rtol_bf16=2e-2)
    cpu = [{"losses": [2.0, 1.0]}, {"losses": [3.0, 1.5]}]
    assert gpu_multirank_check.compare("stage 2 fp32", cpu, cpu, args)[0]
    off = [{"losses": [2.0, 1.0]}, {"losses": [3.0, 1.5 * (1 + 1e-3)]}]
    assert not gpu_multirank_check.compare("stage 2 fp32", off, cpu, args)[0]
    assert gpu_multirank_check.compare("stage 2 bf16", off, cpu, args)[0]  # within bf16's tolerance
    failed = [{"error": "RuntimeError: x"}] * 2
    ok, what = gpu_multirank_check.compare("stage 2 fp32", failed, cpu, args)
    assert not ok and "device failed: RuntimeError: x" in what
