"""Record which functions run in this process, for ``tools/checks/record_surface_calls.py``.

Inert unless ``DS_SURFACE_CALLS_DIR`` is set. The record tool puts this directory first on ``PYTHONPATH``, so
every Python process of the run loads it at start: pytest, its xdist workers, ``subprocess`` children, the
multiprocessing forkserver and (by fork) the rank processes it starts. ``filter.json`` in that directory lists
what to watch: code objects (file, first line, qualified name) and classes (module, qualified name). From a
profile function (``sys.setprofile``; Python 3.11 has no ``sys.monitoring``) each process keeps, for each:

- a code object: entered;
- a class: an object of it constructed or asked about through Python code, i.e. the first argument of an
  ``__init__``/``__new__``/``__post_init__``/``__call__``/``__instancecheck__`` (a class object counts as
  itself, an instance as its class), or the exception class reaching an ``__exit__`` (``pytest.raises``:
  exceptions are built in C, no Python frame of theirs runs);

with the first test it happened in (``PYTEST_CURRENT_TEST``, which pytest sets and child processes inherit),
or None while it has only happened outside a test (imports, collection). At exit (``atexit``, and
``os._exit``, which multiprocessing's children leave through) it writes them to ``calls-<pid>.json`` there.
The profile function slows Python-heavy code about 2x.
"""

from __future__ import annotations

import os
import sys

_DIR = os.environ.get("DS_SURFACE_CALLS_DIR")


def _install(directory: str) -> None:
    import atexit
    import json
    import threading

    with open(os.path.join(directory, "filter.json")) as f:
        wanted = json.load(f)
    code_keys = {tuple(k) for k in wanted["codes"]}
    class_keys = {tuple(k) for k in wanted["classes"]}
    environ, key, missing = os.environ, "PYTEST_CURRENT_TEST", object()
    # code object / class -> False (not watched), None (watched, seen outside tests only), the first test id
    codes: dict = {}
    classes: dict = {}
    ctor = {
        "__init__": 0,
        "__new__": 0,
        "__post_init__": 0,
        "__call__": 0,
        "__instancecheck__": 0,
        "__exit__": 1,
    }

    def note(table: dict, thing, watched) -> None:
        seen = table.get(thing, missing)
        if seen is missing:
            table[thing] = environ.get(key) if watched() else False
        elif seen is None:
            table[thing] = environ.get(key)

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        seen = codes.get(code, missing)
        if seen is missing or seen is None:
            note(codes, code, lambda: (code.co_filename, code.co_firstlineno, code.co_qualname) in code_keys)
        position = ctor.get(code.co_name)
        if position is not None and code.co_argcount > position:
            value = frame.f_locals.get(code.co_varnames[position])
            kind = type(value)  # not isinstance: it reads __class__, which some proxies warn about
            cls = value if issubclass(kind, type) else kind
            if classes.get(cls, missing) is not False:
                note(classes, cls, lambda: (getattr(cls, "__module__", None), cls.__qualname__) in class_keys)

    written: set[int] = set()

    def write() -> None:
        pid = os.getpid()
        if pid in written:
            return
        written.add(pid)
        sys.setprofile(None)
        out = {
            "pid": pid,
            "argv": sys.argv[:3],
            "codes": [
                [c.co_filename, c.co_firstlineno, c.co_qualname, t]
                for c, t in list(codes.items())
                if t is not False
            ],
            "classes": [
                [k.__module__, k.__qualname__, t] for k, t in list(classes.items()) if t is not False
            ],
        }
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
