"""A real DeepSpeed beside ds's ``deepspeed`` is found and warned about, with the fix."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import deepspeed
import pytest
from deepspeed import _shadow

OWN = Path(deepspeed.__file__).parent


def _fake_deepspeed(root: Path) -> Path:
    pkg = root / "deepspeed"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.19.8'\n")
    return root


def test_clean_install_has_no_conflict():
    assert _shadow.find_conflicts() == []


def test_another_deepspeed_on_sys_path_is_found(tmp_path: Path):
    other = _fake_deepspeed(tmp_path)
    problems = _shadow.find_conflicts(path=[*sys.path, str(other)])
    assert any(str(other / "deepspeed") in p for p in problems), problems


def test_real_deepspeed_files_mixed_in_are_found(tmp_path: Path):
    own = tmp_path / "deepspeed"
    (own / "ops" / "csrc").mkdir(parents=True)
    problems = _shadow.find_conflicts(own_dir=own, path=[])
    assert any("mixed into ds's package" in p and "ops/csrc" in p for p in problems), problems


def test_real_deepspeed_dist_info_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    info = tmp_path / "deepspeed-0.19.8.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    problems = _shadow.find_conflicts(path=[])
    assert any("real DeepSpeed distribution record (deepspeed 0.19.8)" in p for p in problems), problems


def test_warning_is_loud_and_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(_fake_deepspeed(tmp_path)))
    with pytest.warns(_shadow.DeepSpeedShadowWarning, match="pip uninstall -y deepspeed"):
        _shadow.warn_conflicts()
    monkeypatch.setenv("DS_DEEPSPEED_SHADOW_CHECK", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _shadow.warn_conflicts() == []
