"""Check the monorepo's package contracts; exit 1 with one line per problem.

1. No package imports a sibling: only ``ds_config`` and the package itself (``ds-engine`` may import all,
   and so may ``deepspeed``, the mapping of DeepSpeed's module paths that sits above ``ds-engine``).
2. Versions move in lock-step: every package has the same version (``deepspeed``'s is the DeepSpeed API
   level it maps with the ds version as local label, ``0.19.8+ds.<version>``).
3. Sibling requirements are ranges (``>=X,<Y``) that admit the current version, ``ds-engine``
   requires every other ds-* package, and ``deepspeed`` requires ``ds-engine``.
4. Every ds_* package a package's source imports is declared in its ``dependencies``.

Usage: python tools/checks/check_deps.py
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
ASSEMBLER = "ds-engine"
MAPPER = "deepspeed"  # DeepSpeed's module paths over ds-engine; version "<DeepSpeed API>+ds.<version>"
_MAPPER_VERSION = re.compile(r"^\d+\.\d+\.\d+\+ds\.(\d+\.\d+\.\d+)$")
FOUNDATION = "ds-config"
_REQ = re.compile(r"^(ds-[a-z-]+)\s*(.*)$")


def import_name(dist: str) -> str:
    return dist.replace("-", "_")


def imported_ds_modules(src: Path, root: Path) -> dict[str, list[str]]:
    """Map each top-level ``ds_*`` module imported under ``src`` to the places ("file:line") importing it."""
    found: dict[str, list[str]] = {}
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top.startswith("ds_"):
                    found.setdefault(top, []).append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def admits(spec: str, version: str) -> bool:
    """True when a ``>=A,<B`` range admits ``version``; anything else is not a range."""
    bounds = dict(re.findall(r"(>=|<)\s*([0-9.]+)", spec))
    if set(bounds) != {">=", "<"}:
        return False
    v = version_tuple(version)
    return version_tuple(bounds[">="]) <= v < version_tuple(bounds["<"])


def check(root: Path = ROOT) -> list[str]:
    """Every contract violation under ``root/packages``, one message each."""
    packages = root / "packages"
    problems: list[str] = []
    projects = {
        p.name: tomllib.loads((p / "pyproject.toml").read_text())["project"]
        for p in sorted(packages.iterdir())
        if (p / "pyproject.toml").exists()
    }
    versions = {name: proj["version"] for name, proj in projects.items()}
    if MAPPER in versions:
        m = _MAPPER_VERSION.match(versions[MAPPER])
        if not m:
            problems.append(
                f"{MAPPER}: version {versions[MAPPER]!r} must be '<DeepSpeed API version>+ds.<ds version>'"
            )
        else:
            versions[MAPPER] = m.group(1)
        if ASSEMBLER not in {r.split(">")[0].split("<")[0].strip() for r in projects[MAPPER]["dependencies"]}:
            problems.append(f"{MAPPER}: must depend on {ASSEMBLER}")
    if len(set(versions.values())) > 1:
        problems.append(f"versions are not in lock-step: {versions}")
    for name, proj in projects.items():
        declared: dict[str, str] = {}
        for req in proj.get("dependencies", []):
            m = _REQ.match(req)
            if m:
                declared[m.group(1)] = m.group(2)
        for dep, spec in declared.items():
            if dep not in projects:
                problems.append(f"{name}: requires unknown package {dep}")
            elif not admits(spec, versions[dep]):
                problems.append(
                    f"{name}: requirement '{dep}{spec}' must be a range '>=X,<Y' admitting {versions[dep]}"
                )
        if name == ASSEMBLER:
            missing = sorted(set(projects) - {ASSEMBLER, MAPPER} - set(declared))
            if missing:
                problems.append(f"{name}: must depend on every package; missing {missing}")
        own = import_name(name)
        for module, places in imported_ds_modules(packages / name / "src", root).items():
            if module == own:
                continue
            dist = module.replace("_", "-")
            if name not in (ASSEMBLER, MAPPER) and module != import_name(FOUNDATION):
                problems.append(
                    f"{name} imports sibling {module} (only ds_config is allowed) at {', '.join(places[:3])}"
                )
            elif dist not in declared:
                problems.append(f"{name} imports {module} but does not declare {dist} in its dependencies")
    return problems


def main() -> int:
    problems = check()
    for p in problems:
        print(f"check_deps: {p}")
    if not problems:
        print(f"check_deps: ok ({len(list((ROOT / 'packages').iterdir()))} packages)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
