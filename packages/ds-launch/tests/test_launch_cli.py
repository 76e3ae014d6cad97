"""The CLI's pure parts: mpirun command, exported environment, option errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from ds_launch import HostfileError
from ds_launch._exports import EnvFileError, exported_environment, read_env_file
from ds_launch._mpirun import build_mpirun_command
from ds_launch.cli import local_rank_specs, run


def test_mpirun_command_is_an_argument_list_with_exports():
    cmd = build_mpirun_command(
        "/x/mpirun",
        {"a": [0, 1], "b": [0, 1, 2]},
        ["python", "-u", "s.py", "--lr", "1; rm -rf /"],
        {"NCCL_DEBUG": "INFO", "PYTHONPATH": "/w"},
        ["--mca", "btl", "self,tcp"],
    )
    assert cmd == [
        "/x/mpirun",
        "-n",
        "5",
        "-H",
        "a:2,b:3",
        "--mca",
        "btl",
        "self,tcp",
        "-x",
        "NCCL_DEBUG=INFO",
        "-x",
        "PYTHONPATH=/w",
        "python",
        "-u",
        "s.py",
        "--lr",
        "1; rm -rf /",
    ]


def test_mpirun_cannot_pin_slots():
    with pytest.raises(HostfileError, match=r"cannot pin them to slots \[1, 3\] on host 'a'"):
        build_mpirun_command("mpirun", {"a": [1, 3]}, ["python"], {})


def test_exported_environment(tmp_path, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / ".deepspeed_env").write_text("A=home\nB=home\n")
    (cwd / ".deepspeed_env").write_text("# comment\n\nB=cwd=with=equals\n")
    env = {
        "NCCL_IB_DISABLE": "1",
        "UCX_TLS": "tcp",
        "PYTHONPATH": "/lib",
        "HOME": str(home),
        "SECRET": "x",
        "MV2_X": "1",
        "MLFLOW_RUN": "r",
    }
    exports = exported_environment(env, cwd, {"MASTER_PORT": "1234"})
    assert exports == {
        "NCCL_IB_DISABLE": "1",
        "UCX_TLS": "tcp",
        "PYTHONPATH": f"{cwd}:/lib",
        "MV2_X": "1",
        "MLFLOW_RUN": "r",
        "A": "home",
        "B": "cwd=with=equals",
        "MASTER_PORT": "1234",
    }


def test_env_file_name_from_ds_env_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    (tmp_path / "custom.env").write_text("K=V\n")
    assert exported_environment({"DS_ENV_FILE": "custom.env"}, tmp_path)["K"] == "V"


def test_env_file_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / ".deepspeed_env"
    path.write_text("A=1\nexport B\n")
    with pytest.raises(EnvFileError, match=r"\.deepspeed_env line 2: expected KEY=VALUE, got 'export B'"):
        read_env_file(path)


def test_local_rank_specs_cuda_visible_devices():
    specs = local_rank_specs([0, 2], ["py", "s.py"], ["x"], {"KEEP": "1"}, "h", 9, gpu_ids=["4", "5", "6"])
    assert [s.argv for s in specs] == [
        ["py", "s.py", "--local_rank=0", "x"],
        ["py", "s.py", "--local_rank=1", "x"],
    ]
    assert specs[1].env["CUDA_VISIBLE_DEVICES"] == "4,6" and specs[1].env["KEEP"] == "1"
    assert (specs[1].env["RANK"], specs[1].env["WORLD_SIZE"], specs[1].env["MASTER_PORT"]) == ("1", "2", "9")


CLI_ERRORS = [
    (["--include", "localhost", "--num_procs", "2"], "Cannot specify num_nodes/gpus with include/exclude"),
    (["--num_nodes", "2"], "Num nodes is >1 but no extra nodes available via hostfile"),
    (["--launcher", "impi"], "invalid choice: 'impi'"),
]


@pytest.mark.parametrize(("args", "message"), CLI_ERRORS)
def test_cli_errors_exit_2_with_the_reason(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        run([*args, "script.py"])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_hostfile_errors(tmp_path, capsys):
    hostfile = tmp_path / "hf"
    hostfile.write_text("a slots=2\nb slots=2\n")
    for args, message in [
        (["--launcher", "local"], "The local launcher runs on one host, but 2 are selected (a, b)"),
        (["-i", "c"], "Hostname 'c' not found in hostfile"),
        (["-i", "a:1", "--launcher", "mpi"], "cannot pin them to slots [1]"),
    ]:
        with pytest.raises(SystemExit):
            run(["-H", str(hostfile), *args, "script.py"])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(["-H", str(Path(tmp_path, "missing")), "script.py"])
    assert "does not exist" in capsys.readouterr().err
