"""DeepSpeed's ``deepspeed.launcher.runner``: the launcher's constants and its entry point, over ds-launch.

``DEEPSPEED_ENVIRONMENT_NAME`` is the file of ``NAME=VALUE`` lines exported on every node (``accelerate
launch`` writes it for multi-node DeepSpeed jobs); ds-launch reads the same file. ``main`` runs ds-launch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ds_launch.cli import build_parser
from ds_launch.cli import main as _ds_launch_main

DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ".deepspeed_env")
DEEPSPEED_ENVIRONMENT_PATHS = [os.path.expanduser("~"), "."]
PDSH_MAX_FAN_OUT = 1024


def parse_args(args: Sequence[str] | None = None):  # noqa: ANN201 (argparse.Namespace)
    """The launcher's arguments, parsed as the ``deepspeed``/``ds-launch`` command parses them."""
    return build_parser().parse_args(args)


def main(args: Sequence[str] | None = None) -> None:
    """Run the launcher (ds-launch) with ``args`` (default: ``sys.argv[1:]``)."""
    _ds_launch_main(args)


__all__ = ["DEEPSPEED_ENVIRONMENT_NAME", "DEEPSPEED_ENVIRONMENT_PATHS", "main", "parse_args"]
