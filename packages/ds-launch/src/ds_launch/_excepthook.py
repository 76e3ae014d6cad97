"""How an uncaught ds_config ``ConfigError`` ends a rank: its message, once per job, without a traceback.

A config error is the user's to fix, and its message says how; a traceback through ds's loading code
only hides it, and every rank of a job printing the same message and traceback multiplies it. So an
uncaught ConfigError prints ``ConfigError: <message>`` on rank 0 (or in a process that is no rank),
and one line on every other rank; another rank's line names its first problem, in case rank 0 did not
fail the same way.

mpirun and torchrun kill the other ranks as soon as one exits non-zero. A rank other than 0 whose
line is out therefore waits, at most ``RANK0_WAIT_S``, before it exits: until rank 0 says it has
printed (a key in the process group's store) or rank 0's store is gone, so that rank 0 is not killed
before it prints in full. No barrier: a rank 0 that did not fail the same way never answers, and the
wait ends at its bound. Rank 0 does not wait for the others' lines (they add nothing to its full
message); one may be missing when mpirun killed that rank before it raised. Every other exception goes to the hook that was there before
(tracebacks stay for bugs). Under ``ds-launch`` the ranks print nothing for a ConfigError and the
launcher prints each message once, naming the ranks that raised it (``_rank_entry``, ``_report``).

Standard library only, and ds_config is not imported: an exception can only be a ConfigError once
ds_config's error module has been imported (importing all of ds_config costs a rank most of a second).
"""

from __future__ import annotations

import os
import sys
from types import TracebackType

__all__ = ["config_error_text", "install_excepthook", "is_config_error"]

# The variables a launcher announces a process's global rank in (as _rank_entry.RANK_ENV_NAMES)
_RANK_ENV_NAMES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
_ONE_LINE_CHARS = 240
RANK0_WAIT_S = 10.0
_PRINTED_KEY = "ds_launch/config_error_printed"


def is_config_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a ds_config ConfigError (without importing ds_config)."""
    errors = sys.modules.get("ds_config._errors")
    return errors is not None and isinstance(exc, errors.ConfigError)


def _rank() -> int | None:
    for name in _RANK_ENV_NAMES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def config_error_text(error: BaseException, rank: int | None) -> str:
    """What an uncaught ConfigError prints on ``rank`` (None: a process that is no rank of a job)."""
    if not rank:
        return f"ConfigError: {error}\n"
    problems = getattr(error, "problems", None) or [error]
    first = str(problems[0])
    if len(first) > _ONE_LINE_CHARS:
        first = first[: _ONE_LINE_CHARS - 3] + "..."
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    source = getattr(error, "source", None)
    where = f" in {source}" if source else ""
    return f"ConfigError on rank {rank}{where} (rank 0 prints it in full if it failed the same way): {first}{more}\n"


def _store():
    """The default process group's store, when torch.distributed is imported and initialised (else None)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_initialized():
            return None
        return dist.distributed_c10d._get_default_store()
    except Exception:  # a torch without it: no wait, as before
        return None


def _after_printing(rank: int | None) -> None:
    """Rank 0: say so in the store. Another rank: wait for that, or rank 0's store to go (bounded)."""
    if rank is None or os.environ.get("DS_LAUNCH_MONITOR"):
        return  # no job, or ds-launch's (its launcher prints the message and stops no rank before it)
    store = _store()
    if store is None:
        return
    try:
        if rank == 0:
            store.set(_PRINTED_KEY, "1")
        else:
            from datetime import timedelta

            store.wait([_PRINTED_KEY], timedelta(seconds=RANK0_WAIT_S))
    except Exception:
        pass  # rank 0 exited (its store with it), did not answer in time, or the store is broken


def install_excepthook() -> None:
    """Print uncaught ConfigErrors as the module docstring says; other exceptions go to the hook that
    was installed before. Installing again while this hook is outermost changes nothing; after another
    hook wrapped it (torch.distributed's ``[rankN]:`` prefix, installed by ``init_process_group``) it
    goes outside again, so that a ConfigError's text is printed as it is."""
    if getattr(sys.excepthook, "ds_config_error_hook", False):
        return
    previous = sys.excepthook

    def _config_error_hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if is_config_error(value):
            rank = _rank()
            sys.stderr.write(config_error_text(value, rank))
            sys.stderr.flush()
            _after_printing(rank)
            return
        previous(kind, value, tb)

    _config_error_hook.ds_config_error_hook = True  # type: ignore[attr-defined]
    sys.excepthook = _config_error_hook
