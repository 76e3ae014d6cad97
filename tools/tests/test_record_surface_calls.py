"""tools/checks/record_surface_calls.py and its recorder (testing/surface_calls/sitecustomize.py): a process started
with the recorder switched on writes what ran, its multiprocessing children too, and the names map to called /
not called as the tool says (a function through what it wraps, a class through its methods, its construction
or an exception class reaching a ``with`` block's ``__exit__``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "record_surface_calls", ROOT / "tools/checks/record_surface_calls.py"
)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

MODULE = textwrap.dedent(
    """
    import dataclasses, functools, multiprocessing

    def plain(): return 1
    def at_import(): return 6
    def never(): return 2
    def inner(): return 3

    @functools.wraps(inner)
    def wrapper(): return inner()

    class WithMethod:
        def method(self): return 4

    @dataclasses.dataclass
    class Data:
        x: int = 0

    @dataclasses.dataclass
    class NeverBuilt:
        y: int = 0

    class Failure(Exception):
        pass

    class Catch:
        def __enter__(self): return self
        def __exit__(self, exc_type, exc, tb): return exc_type is not None

    def in_child(): return 5

    def main():
        plain(); inner(); WithMethod().method(); Data(1)
        with Catch():
            raise Failure("caught")
        child = multiprocessing.get_context("forkserver").Process(target=in_child)
        child.start(); child.join()
    """
)


def test_a_run_records_calls_in_the_process_and_its_children(tmp_path, monkeypatch):
    (tmp_path / "surface_mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import surface_mod

    names = {
        f"x.{n}": getattr(surface_mod, n)
        for n in (
            "plain",
            "never",
            "wrapper",
            "WithMethod",
            "Data",
            "NeverBuilt",
            "Failure",
            "in_child",
            "at_import",
        )
    }
    out = tmp_path / "calls"
    out.mkdir()
    tool.write_filter(out, names)
    env = tool.environment(out)
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{tmp_path}"
    env.pop("PYTEST_CURRENT_TEST", None)
    # plain() and at_import() run before the "test" starts, plain() again inside it
    code = (
        "import os, surface_mod\n"
        "if __name__ == '__main__':\n"
        "    surface_mod.plain(); surface_mod.at_import()\n"
        "    os.environ['PYTEST_CURRENT_TEST'] = 'test_x.py::test_y (call)'\n"
        "    surface_mod.main()\n"
    )
    (tmp_path / "main.py").write_text(code)
    subprocess.run([sys.executable, str(tmp_path / "main.py")], env=env, check=True, timeout=120)
    assert len(list(out.glob("calls-*.json"))) >= 2  # the process and its child wrote
    called = tool.called(names, *tool.collect(out))
    assert {n for n, test in called.items() if test} == {
        "x.plain", "x.wrapper", "x.WithMethod", "x.Data", "x.Failure", "x.in_child"
    }  # fmt: skip
    # the test that ran it (PYTEST_CURRENT_TEST, which child processes inherit), not the import before it
    assert called["x.plain"] == called["x.in_child"] == "test_x.py::test_y"
    assert called["x.at_import"] is None  # ran only outside a test


def test_recorder_is_inert_without_its_variable(tmp_path):
    env = {k: v for k, v in tool.environment(tmp_path).items() if k != "DS_SURFACE_CALLS_DIR"}
    probe = "import sys; print(sys.getprofile())"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None" and not list(tmp_path.iterdir())
