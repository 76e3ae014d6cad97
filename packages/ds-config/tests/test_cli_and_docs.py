"""``python -m ds_config explain|validate`` and the generated reference staying in sync with the models."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ds_config._cli import main

CONFIGS = Path(__file__).parent / "configs"
REPO = Path(__file__).resolve().parents[3]


def test_explain_prints_derived_batch_sizes_and_every_setting(capsys):
    assert main(["explain", str(CONFIGS / "zero2_fp16.json"), "--world-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "train_batch_size                256   (= 8 x 4 x 8)" in out
    assert "explicit argument (--world-size)" in out
    assert "gradient_accumulation_steps" in out and "[derived]" in out
    assert "zero_optimization.offload_optimizer.device" in out and "checkpoint.tag_validation" in out


def test_validate_reports_errors_and_exits_non_zero(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3, "fp16": {"enabld": 1}})
    )
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "2 problems" in err and "did you mean 'fp16.enabled'" in err and "10 != 3 * 3 * 1" in err


def test_validate_world_size_from_mpi_environment(monkeypatch, capsys):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert main(["validate", str(CONFIGS / "reference_all_examples.json")]) == 1
    assert "MPI environment (OMPI_COMM_WORLD_SIZE)" in capsys.readouterr().err


def test_auto_values_on_the_command_line(capsys):
    args = ["validate", str(CONFIGS / "hf_auto.json"), "--auto", "train_micro_batch_size_per_gpu=2"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "train_batch_size = 'auto'" in err  # still unresolved
    assert "train_micro_batch_size_per_gpu = 'auto'" not in err  # resolved by --auto


def test_module_entry_point():
    result = subprocess.run([sys.executable, "-m", "ds_config", "validate", str(CONFIGS / "bf16.json")],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OK:")


@pytest.mark.skipif(
    not (REPO / "tools" / "checks" / "gen_config_reference.py").exists(), reason="needs the monorepo checkout"
)
def test_generated_reference_is_up_to_date():
    result = subprocess.run([sys.executable, str(REPO / "tools" / "checks" / "gen_config_reference.py"), "--check"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_no_torch_import():
    code = (
        "import sys, ds_config; from ds_config._cli import main; "
        f"main(['validate', {str(CONFIGS / 'zero2_fp16.json')!r}]); "
        "assert 'torch' not in sys.modules, 'ds_config imported torch'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_explain_missing_file_is_one_line(capsys):
    assert main(["explain", "missing.json"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("DeepSpeed config missing.json: no such file"), err
