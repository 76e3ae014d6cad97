"""Check that no package imports itself in a circle; exit 1 naming each circle.

Every ``packages/*/src/<name>`` is read with ``ast``: an edge ``a -> b`` is any import in module ``a`` of a
module ``b`` of the same package, wherever the import stands (module level, inside a function, under
``if TYPE_CHECKING:``). A lazy import inside a function still makes the two modules depend on each other,
and whoever changes one has to know the other, so it counts. The only import not counted is the implicit one
of a parent package: ``from .sub import x`` imports ``sub/__init__.py`` and ``sub/x.py`` (when it is a
module) but not the enclosing package's ``__init__``, which importing any submodule runs anyway, and
``from . import x`` where ``x`` is a module names only that module.

A circle is a strongly connected component of that graph with more than one module; each is printed once as ``package: a -> b -> a``.

Usage: python tools/checks/check_import_cycles.py [ROOT]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def package_modules(pkg_dir: Path) -> dict[str, Path]:
    """Map each dotted module name under ``pkg_dir`` (a package directory) to its file."""
    modules: dict[str, Path] = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        parts = list(path.relative_to(pkg_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a (possibly relative) ``from ... import`` names."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The package's own modules that ``module`` imports, each with the first line importing it."""
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            names = [f"{base}.{alias.name}" for alias in node.names]
            # ``from pkg import sub`` imports the module ``pkg.sub``; ``pkg`` itself only for a name it defines
            targets = names + ([base] if any(name not in known for name in names) else [])
        for target in targets:
            if target in known and target != module:
                found.setdefault(target, node.lineno)
    return found


def cycles(graph: dict[str, dict[str, int]]) -> list[tuple[list[str], list[str]]]:
    """Each strongly connected component with a circle: its modules, and a shortest circle through the first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[list[str], list[str]]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; packages are small, recursion depth is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append((sorted(component), _walk(sorted(component), graph)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _walk(component: list[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """A shortest circle from the component's first module back to itself (names the modules to look at)."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start, start]


def check(root: Path = ROOT) -> list[str]:
    problems = []
    for src in sorted(root.glob("packages/*/src")):
        for pkg_dir in sorted(p.parent for p in src.glob("*/__init__.py")):
            known = package_modules(pkg_dir)
            graph = {m: imports_of(m, path, known) for m, path in known.items()}
            for component, circle in cycles(graph):
                steps = [
                    f"{a} ({known[a].relative_to(root)}:{graph[a][b]})"
                    for a, b in zip(circle, circle[1:], strict=False)
                ]
                line = f"{pkg_dir.name}: import circle {' -> '.join([*steps, circle[-1]])}"
                others = sorted(set(component) - set(circle))
                problems.append(line + (f" (with {', '.join(others)} in the same circle)" if others else ""))
    return problems


def main(argv: list[str]) -> int:
    problems = check(Path(argv[1]) if len(argv) > 1 else ROOT)
    for problem in problems:
        print(problem)
    if problems:
        print(
            f"{len(problems)} import circle(s): move what both modules need into a module both import,"
            " or make the dependency one-way",
            file=sys.stderr,
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
