"""Record which functions run in this process, for ``tools/checks/record_surface_calls.py``.

Inert unless ``DS_SURFACE_CALLS_DIR`` is set. The record tool puts this directory first on ``PYTHONPATH``, so
every Python process of the run loads it at start: pytest, its xdist workers, ``subprocess`` children, the
multiprocessing forkserver and (by fork) the rank processes it starts. Each process keeps, from a profile
function (``sys.setprofile``; Python 3.11 has no ``sys.monitoring``):

- every code object entered, with the test running when it was first entered (``PYTEST_CURRENT_TEST``, which
  pytest sets and child processes inherit);
- the class of every object constructed or asked about through Python code: the first argument of an
  ``__init__``/``__new__``/``__post_init__``/``__call__``/``__instancecheck__`` (a class object counts as
  itself, an instance as its class), and the exception class reaching an ``__exit__`` (``pytest.raises``:
  exceptions are built in C, no Python frame of theirs runs).

At exit (``atexit``, and ``os._exit``, which multiprocessing's children leave through) it writes the entries
that ``filter.json`` in that directory lists (code objects by file, first line and qualified name; classes by
module and qualified name) to ``calls-<pid>.json`` there. The profile function slows Python-heavy code about 2x.
"""

from __future__ import annotations

import os
import sys

_DIR = os.environ.get("DS_SURFACE_CALLS_DIR")


def _install(directory: str) -> None:
    import atexit
    import json
    import threading

    environ = os.environ
    codes: dict = {}  # code object -> the test running when it was first entered
    classes: dict = {}  # class -> the test running when it was first seen constructed
    ctor = {
        "__init__": 0,
        "__new__": 0,
        "__post_init__": 0,
        "__call__": 0,
        "__instancecheck__": 0,
        "__exit__": 1,
    }

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code not in codes:
            codes[code] = environ.get("PYTEST_CURRENT_TEST")
        position = ctor.get(code.co_name)
        if position is not None and code.co_argcount > position:
            value = frame.f_locals.get(code.co_varnames[position])
            kind = type(value)  # not isinstance: it reads __class__, which some proxies warn about
            cls = value if issubclass(kind, type) else kind
            if cls not in classes:
                classes[cls] = environ.get("PYTEST_CURRENT_TEST")

    written: set[int] = set()

    def write() -> None:
        pid = os.getpid()
        if pid in written:
            return
        written.add(pid)
        sys.setprofile(None)
        try:
            with open(os.path.join(directory, "filter.json")) as f:
                wanted = json.load(f)
        except OSError:
            return
        code_keys = {tuple(k) for k in wanted["codes"]}
        class_keys = {tuple(k) for k in wanted["classes"]}
        out = {"pid": pid, "argv": sys.argv[:3], "codes": [], "classes": []}
        for c, test in list(codes.items()):
            if (c.co_filename, c.co_firstlineno, c.co_qualname) in code_keys:
                out["codes"].append([c.co_filename, c.co_firstlineno, c.co_qualname, test])
        for k, test in list(classes.items()):
            key = (getattr(k, "__module__", None), getattr(k, "__qualname__", None))
            if key in class_keys:
                out["classes"].append([*key, test])
        path = os.path.join(directory, f"calls-{pid}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(path + ".tmp", path)

    real_exit = os._exit

    def _exit(status):  # multiprocessing's children end with os._exit, past atexit
        try:
            write()
        finally:
            real_exit(status)

    os._exit = _exit
    atexit.register(write)
    threading.setprofile(profile)
    sys.setprofile(profile)


if _DIR:
    _install(_DIR)
