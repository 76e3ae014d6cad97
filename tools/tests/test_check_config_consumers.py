"""tools/checks/check_config_consumers.py: every DSConfig leaf has a consumer or a NO_EFFECT reason."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "checks"))
import check_config_consumers  # noqa: E402


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "packages" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_repository_passes():
    assert check_config_consumers.check() == []


def test_an_undeclared_key_fails(tmp_path: Path):
    tree = _tree(tmp_path, {"ds-x/src/ds_x/__init__.py": 'CONFIG_FIELDS = ("fp16.enabled",)\n'})
    problems = check_config_consumers.check(tree)
    assert any(p.startswith("fp16.loss_scale: no package declares it") for p in problems)
    assert not any(p.startswith("fp16.enabled:") for p in problems)


def test_a_misspelt_declaration_fails(tmp_path: Path):
    tree = _tree(tmp_path, {"ds-x/src/ds_x/_a.py": 'CONFIG_FIELDS: tuple[str, ...] = ("fp16.enable",)\n'})
    assert "fp16.enable: declared in CONFIG_FIELDS of ds-x but is not a DSConfig key" in (
        check_config_consumers.check(tree)
    )


def test_a_no_effect_key_that_is_read_fails(tmp_path: Path):
    tree = _tree(
        tmp_path, {"ds-x/src/ds_x/_a.py": 'CONFIG_FIELDS = ("zero_optimization.elastic_checkpoint",)\n'}
    )
    assert any("NO_EFFECT but read by ds-x" in p for p in check_config_consumers.check(tree))


def test_a_computed_declaration_is_refused(tmp_path: Path):
    tree = _tree(tmp_path, {"ds-x/src/ds_x/_a.py": 'A = ("fp16.enabled",)\nCONFIG_FIELDS = A\n'})
    with pytest.raises(ValueError, match="tuple of string literals"):
        check_config_consumers.check(tree)
