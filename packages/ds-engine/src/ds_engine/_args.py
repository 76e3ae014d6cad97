"""DeepSpeed's argument rules for initialize(): where the config comes from, and LOCAL_RANK checks."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

logger = logging.getLogger("ds_engine")


class InitializeError(ValueError, AssertionError):
    """initialize() was called with arguments that cannot work together; the message says what to change.

    DeepSpeed checks these arguments with ``assert`` (no model, a config in both the arguments and the call,
    no config, a local-rank mismatch), so this is also an ``AssertionError``: code written against DeepSpeed
    that catches ``AssertionError`` catches it.
    """


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add DeepSpeed's command-line arguments (``--deepspeed``, ``--deepspeed_config`` and the deprecated
    ``--deepscale`` / ``--deepscale_config``) to ``parser`` and return it."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument(
        "--deepspeed",
        default=False,
        action="store_true",
        help="Enable DeepSpeed (helper flag for user code, no impact on the engine).",
    )
    group.add_argument(
        "--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file."
    )
    group.add_argument(
        "--deepscale",
        default=False,
        action="store_true",
        help="Deprecated enable DeepSpeed (helper flag for user code, no impact on the engine).",
    )
    group.add_argument(
        "--deepscale_config", default=None, type=str, help="Deprecated DeepSpeed json configuration file."
    )
    return parser


def resolve_config_source(args: Any, config: Any, config_params: Any) -> Any:
    """The one config source among ``args.deepspeed_config``, ``config`` and ``config_params``.

    Rules as DeepSpeed's: the deprecated ``args.deepscale_config`` counts (with a warning); a config in
    ``args`` *and* in ``config`` is an error; ``config_params`` is used only when ``config`` is None.
    """
    from_args = getattr(args, "deepspeed_config", None) if args is not None else None
    deprecated = getattr(args, "deepscale_config", None) if args is not None else None
    if from_args is None and deprecated is not None:
        logger.warning("--deepscale_config is deprecated, use --deepspeed_config instead")
        from_args = deprecated
    if config is None:
        config = config_params
    if from_args is not None and config is not None:
        raise InitializeError(
            "Not sure how to proceed: a config was given both in the arguments (--deepspeed_config="
            f"{from_args!r}) and to initialize(config=...). Pass exactly one of them."
        )
    source = from_args if from_args is not None else config
    if source is None:
        raise InitializeError(
            "DeepSpeed requires a config: pass --deepspeed_config FILE (with add_config_arguments), "
            "or initialize(config=dict_or_path)."
        )
    return source


def check_local_rank(args: Any, local_rank: int) -> None:
    """``args.local_rank`` (when set and >= 0) must agree with the rank the launcher assigned."""
    given = getattr(args, "local_rank", None) if args is not None else None
    if given is not None and int(given) >= 0 and int(given) != local_rank:
        env = os.environ.get("LOCAL_RANK", "unset")
        raise InitializeError(
            f"Mismatch in local rank setting, args.local_rank={given} but env['LOCAL_RANK']={env} "
            f"(the launcher assigned local rank {local_rank}). Let the launcher set --local_rank."
        )
