"""Every config key has a consumer or a stated reason for having none; exit 1 with one line per problem.

Each package that reads config declares a module-level ``CONFIG_FIELDS`` tuple of the dotted DSConfig
paths its code reads (each package's own test checks that the tuple matches what the code reads, with
``ds_config.testing.ConfigReads``). This script reads those tuples from the sources by AST (no package
but ds_config is imported, so torch is not needed) and checks, against every leaf of ``DSConfig``:

1. each leaf is declared by some package or listed in ``ds_config.NO_EFFECT`` (with its reason);
2. each declared path is a leaf of DSConfig (a misspelt or removed key fails here);
3. no key is both declared and listed as having no effect.

Usage: python tools/checks/check_config_consumers.py [--list]
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

import ds_config

ROOT = Path(__file__).resolve().parents[2]
NAME = "CONFIG_FIELDS"


def _literal_paths(node: ast.expr, where: str) -> list[str]:
    if not isinstance(node, (ast.Tuple, ast.List)) or not all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        raise ValueError(f"{where}: {NAME} must be a tuple of string literals (this check reads it by AST)")
    return [e.value for e in node.elts]  # type: ignore[attr-defined]


def declarations(root: Path = ROOT) -> dict[str, list[str]]:
    """Map each dotted path to the packages ("ds-zero") whose sources declare it in ``CONFIG_FIELDS``."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in sorted((root / "packages").iterdir()):
        for path in sorted((package / "src").rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in tree.body:
                target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
                if isinstance(target, ast.Name) and target.id == NAME and node.value is not None:
                    where = str(path.relative_to(root))
                    for dotted in _literal_paths(node.value, where):
                        if package.name not in found[dotted]:
                            found[dotted].append(package.name)
    return dict(found)


def check(root: Path = ROOT) -> list[str]:
    """One line per problem; empty when every leaf has a consumer or a reason."""
    leaves = set(ds_config.leaf_paths())
    declared = declarations(root)
    no_effect = ds_config.NO_EFFECT
    problems = []
    for path in sorted(leaves - set(declared) - set(no_effect)):
        problems.append(
            f"{path}: no package declares it in {NAME}; add it to the {NAME} of the package that reads it, "
            "or to NO_EFFECT in ds-config's _fields.py with the reason"
        )
    for path in sorted(set(declared) - leaves):
        problems.append(
            f"{path}: declared in {NAME} of {', '.join(declared[path])} but is not a DSConfig key"
        )
    for path in sorted(set(no_effect) - leaves):
        problems.append(f"{path}: listed in ds_config.NO_EFFECT but is not a DSConfig key")
    for path in sorted(set(no_effect) & set(declared)):
        problems.append(
            f"{path}: listed in ds_config.NO_EFFECT but read by {', '.join(declared[path])}; remove one"
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--list", action="store_true", help="print every leaf and who consumes it")
    args = parser.parse_args(argv)
    if args.list:
        declared = declarations()
        for path in ds_config.leaf_paths():
            who = ", ".join(declared.get(path, [])) or ("(no effect)" if path in ds_config.NO_EFFECT else "-")
            print(f"{path:60} {who}")
    problems = check()
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print(f"every one of {len(ds_config.leaf_paths())} config keys has a consumer or a stated reason")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
