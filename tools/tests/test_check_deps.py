"""tools/checks/check_deps.py passes on the repository and catches each kind of violation in a copy."""

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "checks"))
import check_deps  # noqa: E402


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of every package's pyproject.toml and sources."""
    for src in sorted((ROOT / "packages").iterdir()):
        dst = tmp_path / "packages" / src.name
        shutil.copytree(src / "src", dst / "src", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(src / "pyproject.toml", dst / "pyproject.toml")
    return tmp_path


def test_repository_passes():
    assert check_deps.check() == []


def test_copy_passes(tree: Path):
    assert check_deps.check(tree) == []


def test_sibling_import_is_reported(tree: Path):
    bad = tree / "packages/ds-zero/src/ds_zero/_bad.py"
    bad.write_text("import os\nfrom ds_engine import initialize\n")
    problems = check_deps.check(tree)
    assert any("ds-zero imports sibling ds_engine" in p and "_bad.py:2" in p for p in problems), problems


def test_version_drift_is_reported(tree: Path):
    pyproject = tree / "packages/ds-zero/pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.1.1"'))
    assert any("lock-step" in p for p in check_deps.check(tree))


def test_pinned_sibling_requirement_is_reported(tree: Path):
    pyproject = tree / "packages/ds-zero/pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"ds-config>=0.1.0,<0.2"', '"ds-config==0.1.0"'))
    assert any("must be a range" in p for p in check_deps.check(tree))


def test_engine_must_depend_on_what_it_imports(tree: Path):
    (tree / "packages/ds-engine/src/ds_engine/_x.py").write_text("import ds_zero\n")
    pyproject = tree / "packages/ds-engine/pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('    "ds-zero>=0.1.0,<0.2",\n', ""))
    assert any("does not declare ds-zero" in p for p in check_deps.check(tree))


def test_deepspeed_mapping_version_drift_is_reported(tree: Path):
    """``deepspeed``'s local label is the ds version: a label behind the ds-* packages is drift."""
    pyproject = tree / "packages/deepspeed/pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace('version = "0.19.8+ds.0.1.0"', 'version = "0.19.8+ds.0.0.9"')
    )
    assert any("lock-step" in p for p in check_deps.check(tree))


def test_deepspeed_mapping_version_without_ds_label_is_reported(tree: Path):
    """A plain DeepSpeed version would pass for a real DeepSpeed: the ``+ds.`` label is required."""
    pyproject = tree / "packages/deepspeed/pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.19.8+ds.0.1.0"', 'version = "0.19.8"'))
    assert any("deepspeed: version '0.19.8'" in p for p in check_deps.check(tree))


def test_deepspeed_mapping_must_require_ds_engine(tree: Path):
    pyproject = tree / "packages/deepspeed/pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('    "ds-engine>=0.1.0,<0.2",\n', ""))
    problems = check_deps.check(tree)
    assert any("deepspeed: must depend on ds-engine" in p for p in problems), problems
