"""The multi-host runners built as DeepSpeed 0.19.8's own tests build them, against its recorded commands.

``fixtures/deepspeed_compat.json`` ("runners", ``tools/fixtures/make_deepspeed_compat_fixtures.py``) holds the
command each of ``PDSHRunner``, ``OpenMPIRunner``, ``MPICHRunner`` and ``MVAPICHRunner`` returns for two
4-slot hosts, with and without ``--launcher_arg "-mca btl_tcp_if_include eth1"``. ds's runners return a
ds-launch command line; this test follows it to the command ds-launch then runs (the mpirun, or pdsh's
arguments) and pins what a user relies on there: the hosts and process counts, the launcher arguments (NIC
options) where DeepSpeed puts them, the exported variables and ``PDSH_RCMD_TYPE``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from deepspeed.launcher import multinode_runner as mnrunner
from deepspeed.launcher.runner import encode_world_info, parse_args
from ds_launch import cli as ds_cli
from ds_launch._ssh import decode_world_info, pdsh_command

RUNNERS = json.loads((Path(__file__).parent / "fixtures/deepspeed_compat.json").read_text())["runners"]
HOSTS = {"worker-0": 4, "worker-1": 4}
ARGVS = {  # as the fixture tool passes them
    "plain": ["test_launcher.py"],
    "btl.one_dash": ["--launcher_arg", "-mca btl_tcp_if_include eth1", "test_launcher.py"],
    "btl.two_dashes": ["--launcher_arg", "--mca btl_tcp_if_include eth1", "test_launcher.py"],
}
CASES = sorted(k for k in RUNNERS if k != "world_info")


def test_encode_world_info_takes_host_counts_as_deepspeed_does():
    assert encode_world_info(HOSTS) == RUNNERS["world_info"]


def _ds_cmd(cls_name: str, case: str, env: dict):
    args = parse_args(ARGVS[case])
    cls = getattr(mnrunner, cls_name)
    world_info = encode_world_info(HOSTS)
    runner = cls(args, world_info) if cls_name == "PDSHRunner" else cls(args, world_info, HOSTS)
    return runner, runner.get_cmd(env, HOSTS)


def _launch_args(cmd: list[str]):
    assert cmd[1:3] == ["-m", "ds_launch.cli"], cmd  # ds runs ds-launch
    return ds_cli.build_parser().parse_args(ds_cli._join_launcher_args(cmd[3:]))


def _after(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def _between(cmd: list[str], start: int, stop_flags: tuple[str, ...]) -> list[str]:
    out = []
    for word in cmd[start:]:
        if word in stop_flags:
            break
        out.append(word)
    return out


@pytest.mark.parametrize("name", CASES)
def test_runner_command_as_deepspeed_0_19_8(name, monkeypatch):
    cls_name, case = name.split(".", 1)
    want = RUNNERS[name]
    runner, got = _ds_cmd(cls_name, case, {"PATH": "/usr/bin"})
    assert runner.name == want["name"]
    if cls_name == "PDSHRunner":
        cmd, _kill, env = got
        assert env["PDSH_RCMD_TYPE"] == want["PDSH_RCMD_TYPE"] == "ssh"
    else:
        cmd = got
    parsed = _launch_args(cmd)
    assert decode_world_info(parsed.resources) == {h: list(range(n)) for h, n in HOSTS.items()}
    assert (parsed.user_script, parsed.user_args) == ("test_launcher.py", [])
    theirs = want["cmd"]
    if cls_name == "PDSHRunner":  # pdsh -S -f 1024 -w HOSTS <launcher args> ...: ds-launch's pdsh the same
        hosts = list(decode_world_info(parsed.resources))
        ours = pdsh_command(["ssh"], hosts, "CMD", shlex.split(parsed.launcher_args))
        assert _after(ours, "-w") == _after(theirs, "-w") and _after(ours, "-f") == _after(theirs, "-f")
        start = theirs.index("-w") + 2
        assert ours[ours.index("-w") + 2 : ours.index("ssh")] == theirs[start : theirs.index("", start)]
        assert parsed.launcher in ("pdsh", "ssh")
        return
    monkeypatch.setattr(ds_cli, "find_mpirun", lambda: "mpirun")
    monkeypatch.setattr(ds_cli, "find_hydra_mpirun", lambda: "mpirun")
    ours = ds_cli.mpi_command(parsed, decode_world_info(parsed.resources), ds_cli._LAUNCHER_ALIASES.get(
        parsed.launcher, parsed.launcher), {})  # fmt: skip
    assert ours[:3] == ["mpirun", "-n", "8"] and theirs[1:3] in (["-n", "8"], ["-np", "8"])
    if cls_name == "OpenMPIRunner":  # -H with counts where DeepSpeed names the hostfile; then its NIC options
        assert _after(ours, "-H") == "worker-0:4,worker-1:4"
        nic = _between(ours, ours.index("-H") + 2, ("-x",))
        assert nic == _between(theirs, theirs.index("-hostfile") + 2, ("-x",))
        assert "-x" in ours and "UCX_TLS=tcp" in ours
        return
    # mpich and mvapich: Hydra's mpirun -n 8 -ppn 4 -hosts worker-0,worker-1 <launcher args> -genv K V ...
    assert _after(ours, "-ppn") == _after(theirs, "-ppn") == "4"
    assert _after(ours, "-hosts") == "worker-0,worker-1"
    launcher_args = _between(ours, ours.index("-hosts") + 2, ("-genv",))
    if cls_name == "MPICHRunner":
        assert launcher_args == _between(theirs, theirs.index("-ppn") + 2, ("-genv",))
        assert ["-genv", "MASTER_PORT", "29500"] == ours[
            ours.index("MASTER_PORT") - 1 : ours.index("MASTER_PORT") + 2
        ]
    else:
        assert launcher_args == _between(theirs, theirs.index("--hostfile") + 2, ("-env",))
        exports = [theirs[i + 1] for i, w in enumerate(theirs) if w == "-env"]
        genv = {f"{ours[i + 1]}={ours[i + 2]}" for i, w in enumerate(ours) if w == "-genv"}
        assert exports and set(exports) <= genv


def test_mpich_needs_the_same_count_on_every_host():
    args = parse_args(["x.py"])
    uneven = {"worker-0": 4, "worker-1": 2}
    with pytest.raises(ValueError, match="MPICH requires same number of devices per node"):
        mnrunner.MPICHRunner(args, encode_world_info(uneven), uneven).get_cmd({}, uneven)
