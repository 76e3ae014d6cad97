"""Which provided functions and classes of ds's ``deepspeed`` the tests call: record it, list what no test calls.

    python tools/checks/record_surface_calls.py                       # run the default suites, rewrite the record
    python tools/checks/record_surface_calls.py --update PYTEST_ARGS  # run some tests, add what they call
    python tools/checks/record_surface_calls.py --keep DIR ...        # keep the per-process files in DIR

Run from the repository root with the packages importable (the dev environment's ``PYTHONPATH``, as for
``check_deepspeed_surface.py``). The surface is every name that ``check_deepspeed_surface.py`` counts as
provided (or provided with a listed difference) whose recorded kind is a function or a class. The tests run
under ``testing/surface_calls/sitecustomize.py`` (first on ``PYTHONPATH``, switched on by
``DS_SURFACE_CALLS_DIR``), so the rank processes, ``subprocess`` children and xdist workers record too. A name
counts as called when its object (an alias: the object it names) ran: a function's code (or the code it wraps,
``functools.wraps``), a class's own method or property, or an instance of the class was constructed or
checked with ``isinstance`` through Python code, or the exception class reached a ``with pytest.raises``.

The record, ``tools/checks/deepspeed_surface_calls.json``, maps each called name to one test that calls it (the
first seen; another run may name another). ``check_deepspeed_surface.py`` fails on a provided function or class
that is neither in it nor in ``NOT_CALLED`` (``deepspeed_surface_table.py``, with the reason), and on a recorded
name that is no longer provided. A new provided name: write its test, then
``python tools/checks/record_surface_calls.py --update path/to/test_file.py``.

The default run is ``packages/deepspeed/tests`` and ds-checkpoint's RNG-tracker tests (DeepSpeed's
``get_cuda_rng_tracker`` and ``model_parallel_cuda_manual_seed`` are ds_checkpoint's, tested there), on two
pytest workers: about 10 minutes on 2 busy cores (the profile function slows Python-heavy code about 2x).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "tools/checks/deepspeed_surface_calls.json"
RECORDER = ROOT / "testing/surface_calls"
DEFAULT_TESTS = [
    "packages/deepspeed/tests",
    "packages/ds-checkpoint/tests/activation/test_activation_rng.py",
    "-n",
    "2",
    "--dist",
    "loadfile",
]
KINDS = ("function", "class")


def _check() -> Any:
    spec = importlib.util.spec_from_file_location(
        "check_deepspeed_surface", ROOT / "tools/checks/check_deepspeed_surface.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def surface(result: Any = None) -> dict[str, Any]:
    """Every provided (or differing) function and class name of the record, with ds's object for it."""
    check = _check()
    result = result if result is not None else check.check()
    record = json.loads(check.RECORD.read_text())
    out = {}
    for item in result.items:
        if item.is_method or item.status not in ("provided", "differs"):
            continue
        name = item.path[len(item.module) + 1 :]
        if record["modules"][item.module]["names"][name]["kind"] not in KINDS:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[item.path] = getattr(importlib.import_module(item.module), name)
    return out


def _functions_of(obj: Any) -> Iterator[Any]:
    """The Python functions whose running means ``obj`` ran: itself and what it wraps; a class's own methods."""
    if inspect.isclass(obj):
        for attr in vars(obj).values():
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if isinstance(attr, property):
                for f in (attr.fget, attr.fset, attr.fdel):
                    yield from _functions_of(f) if inspect.isfunction(f) else ()
            elif isinstance(attr, functools.cached_property):
                yield from _functions_of(attr.func)
            elif inspect.isfunction(attr):
                yield from _functions_of(attr)
        return
    if isinstance(obj, functools.partial):
        yield from _functions_of(obj.func)
        return
    seen = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        if inspect.isfunction(obj):
            yield obj
        elif not inspect.isroutine(obj) and callable(obj):  # a callable instance: its class's __call__
            yield from _functions_of(type(obj))
            return
        obj = getattr(obj, "__wrapped__", None)


def _class_of(obj: Any) -> type | None:
    if inspect.isclass(obj):
        return obj
    if not inspect.isroutine(obj) and not isinstance(obj, functools.partial) and callable(obj):
        return type(obj)
    return None


def keys(obj: Any) -> tuple[set[tuple[str, int, str]], tuple[str, str] | None]:
    """The code keys (file, first line, qualified name) and the class key (module, qualified name) of ``obj``."""
    codes = {
        (f.__code__.co_filename, f.__code__.co_firstlineno, f.__code__.co_qualname)
        for f in _functions_of(obj)
        if not f.__code__.co_filename.startswith("<")  # generated (a dataclass's __init__): one name for many
    }
    cls = _class_of(obj)
    return codes, ((cls.__module__, cls.__qualname__) if cls is not None else None)


def _test_id(test: str | None) -> str | None:
    return test.rsplit(" (", 1)[0] if test else None  # "path::name (call)" -> "path::name"


def write_filter(directory: Path, names: dict[str, Any]) -> None:
    """The code and class keys of ``names`` into ``directory/filter.json``: what each process writes out."""
    codes, classes = set(), set()
    for obj in names.values():
        code_keys, cls = keys(obj)
        codes |= code_keys
        if cls is not None:
            classes.add(cls)
    (directory / "filter.json").write_text(json.dumps({"codes": sorted(codes), "classes": sorted(classes)}))


def environment(directory: Path) -> dict[str, str]:
    """This process's environment with the recorder switched on, writing into ``directory``."""
    env = dict(os.environ)
    env["DS_SURFACE_CALLS_DIR"] = str(directory)
    env["PYTHONPATH"] = os.pathsep.join([str(RECORDER), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run(pytest_args: list[str], directory: Path, names: dict[str, Any]) -> int:
    """Run pytest under the recorder, writing per-process files into ``directory``."""
    write_filter(directory, names)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
    print("running:", " ".join(command), flush=True)
    return subprocess.run(command, cwd=ROOT, env=environment(directory)).returncode


def collect(directory: Path) -> tuple[dict[tuple, str | None], dict[tuple, str | None]]:
    """Every process's codes and classes, each with the first (smallest) test that ran it; None where it ran
    only outside tests (at import, during collection)."""
    codes: dict[tuple, str | None] = {}
    classes: dict[tuple, str | None] = {}
    for path in directory.glob("calls-*.json"):
        data = json.loads(path.read_text())
        for table, rows in ((codes, data["codes"]), (classes, data["classes"])):
            for *key, test in rows:
                key, test = tuple(key), _test_id(test)
                old = table.get(key)
                table[key] = min(old, test) if old and test else old or test
    return codes, classes


def called(
    names: dict[str, Any], codes: dict[tuple, str | None], classes: dict[tuple, str | None]
) -> dict[str, str | None]:
    """Each surface name and a test that calls it (None: no test does, whatever ran outside tests)."""
    out: dict[str, str | None] = {}
    for name, obj in names.items():
        code_keys, cls = keys(obj)
        witnesses = [codes[k] for k in code_keys if codes.get(k)]
        if cls is not None and classes.get(cls):
            witnesses.append(classes[cls])
        out[name] = min(witnesses) if witnesses else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="add to the record instead of rewriting it")
    parser.add_argument("--keep", metavar="DIR", help="write the per-process files here and keep them")
    parser.add_argument(
        "--from", dest="source", metavar="DIR", help="do not run: read the files of a kept run"
    )
    parser.add_argument(
        "pytest_args", nargs="*", help=f"what pytest runs (default: {' '.join(DEFAULT_TESTS)})"
    )
    args, extra = parser.parse_known_args(argv)
    args.pytest_args += extra  # pytest's own options (-x, -n 0, -k ...)
    names = surface()
    code = 0
    with tempfile.TemporaryDirectory(prefix="surface-calls-") as tmp:
        directory = Path(args.source or args.keep or tmp)
        if not args.source:
            directory.mkdir(parents=True, exist_ok=True)
            code = run(args.pytest_args or DEFAULT_TESTS, directory, names)
        result = called(names, *collect(directory))
    previous = json.loads(RECORD.read_text())["called"] if args.update and RECORD.exists() else {}
    calls = {n: previous.get(n) or test for n, test in result.items() if previous.get(n) or test}
    RECORD.write_text(
        json.dumps(
            {
                "about": "provided functions and classes of ds's deepspeed that a test calls, each with one "
                "such test (another run may name another); written by tools/checks/record_surface_calls.py, "
                "read by tools/checks/check_deepspeed_surface.py",
                "called": dict(sorted(calls.items())),
            },
            indent=1,
        )
        + "\n"
    )
    missing = sorted(n for n in names if n not in calls)
    print(f"{len(names)} provided functions and classes, {len(calls)} called by a test, {len(missing)} not:")
    for name in missing:
        print("  ", name)
    if code:
        print(f"pytest exited with {code}: the record may miss what the failed tests call")
    return code


if __name__ == "__main__":
    sys.exit(main())
