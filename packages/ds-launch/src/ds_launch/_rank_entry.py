"""How ``ds-launch`` starts each rank: ``python .../ds_launch/_rank_entry.py [-m] TARGET ARGS...``.

It is run by path, not with ``-m``: importing the ``ds_launch`` package first cost every rank ~0.3 s
on a loaded 2-core machine. So it imports little, and only from the standard library.

It runs TARGET exactly as ``python TARGET ARGS`` (or ``python -m TARGET ARGS``) would, with two
additions the launcher's report depends on:

* stdout and stderr are line-buffered: every line a rank writes leaves it in one ``write()``.
  ``python -u`` (or PYTHONUNBUFFERED) would instead write ``print``'s text and its newline in two
  calls, so that lines of ranks sharing one output (mpirun's) could be glued mid-line.
* how the rank ends (its exit code, or the exception that ended it) is written to
  ``$DS_LAUNCH_EVENTS_DIR/rank<RANK>.json`` before interpreter exit runs the at-exit teardown.
  Teardown can keep a failed rank alive longer than the peers it made fail; the timestamp taken
  here lets the launcher name the rank that failed first. The same record goes to the launcher's monitor
  (``_heartbeat.py``, which also beats every second while the rank lives): ranks on other hosts reach the
  launcher that way, whatever the file systems. A ds_config ConfigError that made it into
  the record is not printed by the rank: the launcher prints each such message once for the job.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType

__all__ = ["EVENTS_DIR_ENV", "RANK_ENV_NAMES", "main", "rank_from_env"]

EVENTS_DIR_ENV = "DS_LAUNCH_EVENTS_DIR"
# ds-launch's local launcher sets RANK; under mpirun the MPI runtime says it.
RANK_ENV_NAMES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
# Fragments of the errors gloo and NCCL raise in a rank whose peer went away: such a rank failed
# because of another one, which the launcher should name first.
_PEER_LOST_MARKERS = ("connection closed by peer", "connection reset by peer", "broken pipe")
_TRACEBACK_LINES = 12
_SIGINT = 2  # (the signal module would be one more import at every rank's start)


def rank_from_env(env: dict[str, str] | os._Environ) -> int | None:
    """This process's global rank as its launcher announced it, or None."""
    for name in RANK_ENV_NAMES:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def _exit_code(exc: SystemExit) -> int:
    """The status the interpreter will exit with for ``exc`` (``sys.exit("message")`` exits 1)."""
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def _peer_lost(exc: BaseException) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # the gloo error may be the cause of the user's
        seen.add(id(exc))
        if any(marker in str(exc).lower() for marker in _PEER_LOST_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def _is_config_error(exc: BaseException) -> bool:
    """A ds_config ConfigError, without importing ds_config (as ``_excepthook.is_config_error``)."""
    errors = sys.modules.get("ds_config._errors")
    return errors is not None and isinstance(exc, errors.ConfigError)


def _start_heartbeat() -> object | None:
    """The rank's connection to the launcher's monitor (``_heartbeat.py``, loaded by path as this file is run)."""
    if not os.environ.get("DS_LAUNCH_MONITOR"):
        return None
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_heartbeat.py")
    spec = importlib.util.spec_from_file_location("_ds_launch_heartbeat", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    sys.modules[module.LIVE_MODULE] = module  # where ds_launch.set_rank_role finds the rank's heartbeat
    return module.start_from_env(rank_from_env(os.environ))


_heartbeat = None


def _record_end(code: int, exc: BaseException | None) -> bool:
    """Write how this rank ends (a file in the events folder, and to the launcher's monitor), and say
    whether it was recorded; never let a problem with the record change how the rank exits."""
    t_ns = time.monotonic_ns()  # first: this is the moment the launcher orders failures by
    directory, rank = os.environ.get(EVENTS_DIR_ENV), rank_from_env(os.environ)
    if rank is None or (not directory and _heartbeat is None):
        return False
    import json  # only now: the script's start must not pay for what only its end needs
    import traceback

    record: dict[str, object] = {"rank": rank, "code": code, "t_ns": t_ns, "pid": os.getpid()}
    if getattr(_heartbeat, "role", ""):
        record["role"] = _heartbeat.role  # type: ignore[attr-defined]
    if exc is not None and not isinstance(exc, SystemExit):
        record["peer_lost"] = _peer_lost(exc)
        trimmed = exc.with_traceback(_without_our_frames(exc.__traceback__))
        record["traceback"] = traceback.format_exception(trimmed)[-_TRACEBACK_LINES:]
        if _is_config_error(exc):
            record["config_error"] = str(exc)  # the launcher prints it once for the job
    if _heartbeat is not None:
        record["host"] = _heartbeat_host()
        _heartbeat.end(record)  # type: ignore[attr-defined]
    if not directory:
        return True
    try:
        path = os.path.join(directory, f"rank{rank}.json")
        with open(path + ".tmp", "w") as tmp:
            json.dump(record, tmp)
        os.replace(path + ".tmp", path)  # the launcher never reads half a record
    except OSError:
        # e.g. a host of an mpirun job that does not share the launcher's file system: the monitor has it
        return _heartbeat is not None
    return True


def _heartbeat_host() -> str:
    import socket

    return socket.gethostname()


def _run_script(path: str) -> None:
    """Run a script file in a new ``__main__`` module that stays ``__main__`` (as ``python path``
    does, so that at-exit code can still pickle its classes). Not ``runpy.run_path``: its imports
    cost every rank ~0.1 s at start. A directory or zip file with ``__main__.py`` goes to runpy."""
    if not os.path.isfile(path) or path.endswith((".zip", ".pyz")):
        import runpy

        runpy.run_path(path, run_name="__main__")
        return
    from importlib.machinery import SourceFileLoader

    main = type(sys)("__main__")
    main.__file__, main.__cached__ = path, None
    main.__loader__ = SourceFileLoader("__main__", path)
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _without_our_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the user's code on: this module's and runpy's frames are noise."""
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
        tb = tb.tb_next
    return tb


def _report_uncaught(exc: BaseException, recorded: bool) -> None:
    """What the interpreter does for an uncaught exception: set ``sys.last_*`` (at-exit code such as
    ``init_distributed``'s teardown reads them) and print the traceback through ``sys.excepthook``.
    A ConfigError in the rank's record is not printed: the launcher prints it once for all ranks."""
    exc = exc.with_traceback(_without_our_frames(exc.__traceback__))
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    if recorded and _is_config_error(exc):
        return
    sys.excepthook(type(exc), exc, exc.__traceback__)


def _line_buffered() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            pass  # replaced by something that is not a TextIOWrapper


def main(argv: list[str]) -> None:
    """Run ``argv`` = ``[-m] TARGET ARGS...`` as ``python`` would, recording how it ends."""
    global _heartbeat
    as_module = argv[:1] == ["-m"]
    target, args = (argv[1], argv[2:]) if as_module else (argv[0], argv[1:])
    _line_buffered()
    _heartbeat = _start_heartbeat()
    try:
        if as_module:
            sys.argv = [target, *args]  # run_module puts the module's path in argv[0], as -m does
            sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
            import runpy

            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            # `python script.py` puts the script's directory first on sys.path, not the working directory.
            sys.path[0] = os.path.dirname(os.path.realpath(target))
            _run_script(target)
    except SystemExit as exc:
        _record_end(_exit_code(exc), exc)
        raise
    except KeyboardInterrupt as exc:
        _record_end(128 + _SIGINT, exc)
        raise  # the interpreter then ends the process by SIGINT, as it does for a plain script
    except BaseException as exc:
        _report_uncaught(exc, recorded=_record_end(1, exc))
        raise SystemExit(1) from None
    _record_end(0, None)


if __name__ == "__main__":
    main(sys.argv[1:])
