"""Start ranks on other hosts over a remote shell (ssh, or pdsh over it): no MPI needed.

ds-launch runs one *node launcher* per host (``python -m ds_launch.cli --world_info=... --node_rank=K``,
the local launcher given the whole job's layout, as DeepSpeed's ``launch.py``), through a remote shell:
``ssh HOST 'cd CWD && exec env K=V ... python -m ds_launch.cli ...'``. Each node launcher starts and
supervises its host's ranks exactly as the local launcher does (whole-line output, rank records, the
failure report); ds-launch supervises the node launchers the same way, one process per host, so a host
that fails (its ranks, or its ssh) stops the others at once and is named in the report.

A node launcher stops its ranks when its remote shell goes (its parent dies: a lost ssh connection,
or ds-launch stopping the host), so no rank outlives the job on any host.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ._hostfile import HostfileError
from ._supervise import ChildSpec

__all__ = [
    "SSH_CMD_ENV",
    "SSH_DEFAULT",
    "PDSH_MAX_FAN_OUT",
    "RemoteShellError",
    "encode_world_info",
    "decode_world_info",
    "remote_shell",
    "node_launcher_argv",
    "remote_command",
    "host_specs",
    "pdsh_command",
    "first_address",
]

SSH_CMD_ENV = "DS_LAUNCH_SSH"  # the remote shell, when --ssh_cmd is not given (default: ssh)
PDSH_MAX_FAN_OUT = 1024  # DeepSpeed's -f
SSH_DEFAULT = ["ssh", "-o", "BatchMode=yes"]  # never wait at a password prompt nobody sees
_ADDRESS_TIMEOUT_S = 60.0


class RemoteShellError(RuntimeError):
    """The remote shell could not run a command on a host (before any rank started)."""


def encode_world_info(active: Mapping[str, Sequence[int]]) -> str:
    """``{host: [slots]}`` as DeepSpeed passes it to each node: URL-safe base64 of its JSON."""
    return base64.urlsafe_b64encode(json.dumps({h: list(s) for h, s in active.items()}).encode()).decode()


def decode_world_info(text: str) -> dict[str, list[int]]:
    try:
        world = json.loads(base64.urlsafe_b64decode(text.encode()))
    except ValueError:
        raise HostfileError(f"--world_info {text!r} is not base64 JSON of {{host: [slots]}}") from None
    if not isinstance(world, dict) or not all(isinstance(s, list) for s in world.values()):
        raise HostfileError(f"--world_info must encode {{host: [slots]}}, got {world!r}")
    return world


def remote_shell(ssh_cmd: str, env: Mapping[str, str]) -> list[str]:
    """The command that runs ``COMMAND`` on ``HOST`` when called as ``<it> HOST COMMAND``:
    ``--ssh_cmd``, else ``$DS_LAUNCH_SSH``, else ``ssh -o BatchMode=yes``."""
    text = ssh_cmd or env.get(SSH_CMD_ENV, "")
    argv = shlex.split(text) if text else list(SSH_DEFAULT)
    if shutil.which(argv[0]) is None:
        raise RemoteShellError(
            f"remote shell {argv[0]!r} not found; install openssh-client or set --ssh_cmd / ${SSH_CMD_ENV}"
        )
    return argv


def node_launcher_argv(
    world_info: str,
    node: str,
    master_addr: str,
    master_port: int,
    flags: Sequence[str],
    program: Sequence[str],
) -> list[str]:
    """The node launcher's argv on a host; ``node`` is ``--node_rank=K`` or ``--node_host=%h`` (pdsh)."""
    return [
        sys.executable,
        "-m",
        "ds_launch.cli",
        "--launcher",
        "local",
        f"--world_info={world_info}",
        node,
        "--master_addr",
        master_addr,
        "--master_port",
        str(master_port),
        *flags,
        *program,
    ]


def remote_command(argv: Sequence[str], exports: Mapping[str, str], cwd: Path, venv_script: str = "") -> str:
    """One shell line for the remote shell: into the launch directory, the exported variables, exec."""
    source = f". {shlex.quote(venv_script)} && " if venv_script else ""
    env = [f"{k}={v}" for k, v in exports.items()]
    return f"{source}cd {shlex.quote(str(cwd))} && exec env {shlex.join([*env, *argv])}"


def host_specs(
    rsh: Sequence[str], active: Mapping[str, Sequence[int]], command_for: callable
) -> list[ChildSpec]:
    """One supervised process per host: ``<rsh> HOST <its node launcher's command line>``."""
    specs, first = [], 0
    for node_rank, (host, slots) in enumerate(active.items()):
        ranks = list(range(first, first + len(slots)))
        first += len(slots)
        name = f"host {host} (rank{'s' if len(ranks) > 1 else ''} {_span(ranks)})"
        specs.append(ChildSpec(name, [*rsh, host, command_for(node_rank)], dict(os.environ)))
    return specs


def pdsh_command(
    rsh: Sequence[str], hosts: Sequence[str], command: str, launcher_args: Sequence[str]
) -> list[str]:
    """``pdsh -S -f 1024 -R exec -w h1,h2 <launcher_args> <rsh> %h COMMAND``: pdsh runs the same remote
    shell on every host (its exec module substitutes ``%h``) and exits with the largest exit code (-S)."""
    return [
        "pdsh",
        "-S",
        "-f",
        str(PDSH_MAX_FAN_OUT),
        "-R",
        "exec",
        "-w",
        ",".join(hosts),
        *launcher_args,
        *rsh,
        "%h",
        command,
    ]


def first_address(rsh: Sequence[str], host: str) -> str:
    """The first address ``hostname -I`` prints on ``host`` (DeepSpeed's way to find rank 0's address)."""
    try:
        out = subprocess.run(
            [*rsh, host, "hostname -I"], capture_output=True, text=True, timeout=_ADDRESS_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise RemoteShellError(
            f"'{shlex.join([*rsh, host, 'hostname -I'])}' did not answer within {_ADDRESS_TIMEOUT_S:g} s; "
            "check that the host is reachable, or pass --master_addr"
        ) from None
    words = out.stdout.split()
    if out.returncode != 0 or not words:
        detail = out.stderr.strip().splitlines()[-1:] or [f"exit code {out.returncode}, no address printed"]
        raise RemoteShellError(
            f"could not find host {host}'s address with '{shlex.join([*rsh, host, 'hostname -I'])}' "
            f"({detail[0]}); check that the remote shell reaches it (passwordless), or pass --master_addr"
        )
    return words[0]


def _span(ranks: Sequence[int]) -> str:
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
