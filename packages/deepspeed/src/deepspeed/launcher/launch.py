"""DeepSpeed's ``deepspeed.launcher.launch``: start one host's ranks of a job laid out by ``--world_info``.

``python -m deepspeed.launcher.launch --world_info=B64 --node_rank=K --master_addr A --master_port P
script.py args`` runs ds-launch's node launcher (``ds-launch --world_info=... --node_rank=K``): this host's
ranks get their global RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK/CROSS_SIZE and
``--local_rank=<i>`` (unless ``--no_local_rank``), and are supervised as under ds-launch.
"""

from __future__ import annotations

import sys
from argparse import REMAINDER, ArgumentParser, Namespace
from collections.abc import Sequence

from ds_engine import FeatureNotAvailableError
from ds_launch import terminate_process_tree as _terminate_tree
from ds_launch.cli import run as _run_ds_launch

PID_FILE_BASEPATH = "/tmp"
TORCH_DISTRIBUTED_DEFAULT_PORT = 29500
CROSS_RANK, CROSS_SIZE = "CROSS_RANK", "CROSS_SIZE"  # this host's index and the number of hosts, per rank

__all__ = ["PID_FILE_BASEPATH", "parse_args", "main"]


def parse_args(args: Sequence[str] | None = None) -> Namespace:
    """DeepSpeed 0.19.8's ``launch.py`` arguments, with its names and defaults."""
    p = ArgumentParser(description="DeepSpeed (ds) launch: start this host's ranks of a multi-host job")
    p.add_argument("--node_rank", type=int, default=0, help="this host's index in --world_info")
    p.add_argument("--master_addr", default="127.0.0.1", type=str, help="rank 0's address")
    p.add_argument("--master_port", default=TORCH_DISTRIBUTED_DEFAULT_PORT, type=int, help="rendezvous port")
    p.add_argument("--world_info", default="None", type=str, help="base64 JSON {host: [slots]}")
    p.add_argument("--module", action="store_true", help="run the script as a module (python -m)")
    p.add_argument("--no_python", action="store_true", help="run the script itself, not through python")
    p.add_argument("--no_local_rank", action="store_true", help="do not pass --local_rank=<i>")
    p.add_argument("--save_pid", type=int, default=0, help="not available in ds")
    p.add_argument("--enable_each_rank_log", default="None", type=str, help="not available in ds")
    p.add_argument("--bind_cores_to_rank", action="store_true", help="each rank on its share of the cores")
    p.add_argument("--bind_core_list", type=str, default=None, help="the cores to share out, e.g. 1,3-5,7")
    p.add_argument(
        "--log_level", type=str, default="info", choices=["debug", "info", "warning", "error", "critical"]
    )
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("training_script", type=str, help="the training script, followed by its arguments")
    p.add_argument("training_script_args", nargs=REMAINDER)
    return p.parse_args(args)


def main(args: Sequence[str] | None = None) -> None:
    parsed = parse_args(args)
    if parsed.world_info == "None":
        raise ValueError("world_info can not be None")
    for option, unset in (("save_pid", 0), ("enable_each_rank_log", "None")):
        if getattr(parsed, option) != unset:
            raise FeatureNotAvailableError(
                f"deepspeed.launcher.launch --{option} is not available in ds (DeepSpeed has it); run without it"
            )
    argv = [
        f"--world_info={parsed.world_info}",
        f"--node_rank={parsed.node_rank}",
        "--master_addr",
        parsed.master_addr,
        "--master_port",
        str(parsed.master_port),
        *[
            f"--{flag}"
            for flag in ("module", "no_python", "no_local_rank", "bind_cores_to_rank")
            if getattr(parsed, flag)
        ],
        *([f"--bind_core_list={parsed.bind_core_list}"] if parsed.bind_core_list else []),
        parsed.training_script,
        *parsed.training_script_args,
    ]
    code = _run_ds_launch(argv)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()


def terminate_process_tree(pid: int) -> None:
    """DeepSpeed's helper: SIGTERM ``pid`` and its descendants, SIGKILL what is left after 30 s."""
    _terminate_tree(pid, grace_s=30.0)
