"""How an uncaught ds_config ``ConfigError`` ends a rank: its message, once per job, without a traceback.

A config error is the user's to fix, and its message says how; a traceback through ds's loading code
only hides it, and every rank of a job printing the same message and traceback multiplies it. So an
uncaught ConfigError prints ``ConfigError: <message>`` on rank 0 (or in a process that is no rank),
and one line on every other rank. Ranks cannot wait for each other while failing, so rank 0 prints
in full even when another rank failed first; another rank's line still names its first problem, in
case rank 0 did not fail the same way. Every other exception goes to the hook that was there before
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
            sys.stderr.write(config_error_text(value, _rank()))
            sys.stderr.flush()
            return
        previous(kind, value, tb)

    _config_error_hook.ds_config_error_hook = True  # type: ignore[attr-defined]
    sys.excepthook = _config_error_hook
