"""tools/checks/check_import_cycles.py passes on the repository and names a circle in a tiny package."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "checks"))
import check_import_cycles  # noqa: E402


def _package(root: Path, files: dict[str, str]) -> Path:
    """packages/ds-tiny/src/ds_tiny with ``files`` (path under ds_tiny -> source)."""
    pkg = root / "packages/ds-tiny/src/ds_tiny"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return root


def test_repository_passes():
    assert check_import_cycles.check() == []


def test_one_way_imports_pass(tmp_path: Path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "from ._a import A\nfrom . import _b\n",
            "_a.py": "from ._base import BASE\nA = BASE\n",
            "_b.py": "from ds_tiny._a import A\nimport ds_tiny._base\n",
            "_base.py": "BASE = 1\n",
            "sub/__init__.py": "from .._a import A\n",
            "sub/_c.py": "from . import _d\nfrom ..sub import _d as d2\n",
            "sub/_d.py": "from .._base import BASE\n",
        },
    )
    assert check_import_cycles.check(root) == []


def test_module_level_circle_is_named(tmp_path: Path):
    root = _package(
        tmp_path, {"_a.py": "from ._b import B\nA = 1\n", "_b.py": "import os\nfrom ._a import A\nB = 2\n"}
    )
    problems = check_import_cycles.check(root)
    assert len(problems) == 1, problems
    assert "ds_tiny: import circle ds_tiny._a" in problems[0]
    assert "_a.py:1" in problems[0] and "_b.py:2" in problems[0] and "-> ds_tiny._b" in problems[0]
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools/checks/check_import_cycles.py"), str(root)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "ds_tiny._a" in done.stdout, done


@pytest.mark.parametrize(
    "lazy",
    [
        "def f():\n    from ..sub._c import C\n    return C\n",  # inside a function, relative, across subpackages
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ds_tiny.sub._c import C\n",
        "def f():\n    from ds_tiny.sub import _c\n    return _c\n",  # the module imported by name from its package
    ],
)
def test_lazy_and_type_only_imports_count(tmp_path: Path, lazy: str):
    root = _package(
        tmp_path,
        {
            "sub/__init__.py": "",
            "sub/_c.py": "from ..other._x import X\nC = X\n",
            "other/__init__.py": "",
            "other/_x.py": lazy + "X = 1\n",
        },
    )
    problems = check_import_cycles.check(root)
    assert len(problems) == 1 and "ds_tiny.other._x" in problems[0] and "ds_tiny.sub._c" in problems[0], (
        problems
    )


def test_circle_of_three_names_every_module(tmp_path: Path):
    root = _package(
        tmp_path,
        {
            "_a.py": "from . import _b\n",
            "_b.py": "from . import _c\n",
            "_c.py": "from ._a import *\n",
            "_d.py": "from . import _a\n",
        },
    )
    (problem,) = check_import_cycles.check(root)
    assert (
        "ds_tiny._a" in problem
        and "ds_tiny._b" in problem
        and "ds_tiny._c" in problem
        and "_d" not in problem
    )
