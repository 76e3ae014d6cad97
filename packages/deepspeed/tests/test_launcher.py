"""``deepspeed.launcher`` against DeepSpeed 0.19.8's record (tools/fixtures/make_deepspeed_launcher_fixtures.py).

Results must be equal; an error must be of DeepSpeed's class (ds's HostfileError is a ValueError) and its
message must start with DeepSpeed's (ds adds where: the hostfile line, the spec). ``DIFFERENCES`` lists the
cases where ds deliberately differs, with the reason; each is checked to still differ as stated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest
from deepspeed.launcher import constants, launch, multinode_runner, runner

RECORD = json.loads((Path(__file__).parent / "fixtures" / "deepspeed_launcher.json").read_text())

# (group, case) -> why ds differs; the test asserts that it does differ there
DIFFERENCES = {
    ("parse_hostfile", "slots_suffix"): "'slots=4x' is an error in ds; DeepSpeed's unanchored regex reads 4",
    (
        "parse_resource_filter",
        "worker-0@worker-0:1|",
    ): "a host named whole and with slots is the whole host in ds; DeepSpeed keeps only the slots",
    ("parse_resource_filter", "worker-0:x|"): "ds names the bad slot list (DeepSpeed: int()'s message)",
}


def _outcome(fn, *args):
    try:
        return {"result": json.loads(json.dumps(fn(*args)))}
    except Exception as exc:  # noqa: BLE001 - compared with the record
        return {"error": {"mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}}


def _same(ours: dict, theirs: dict) -> bool:
    if "result" in theirs:
        return ours == {"result": theirs["result"]}
    if "error" not in ours:
        return False
    return theirs["error"]["mro"][0] in ours["error"]["mro"] and ours["error"]["message"].startswith(
        theirs["error"]["message"]
    )


def _check(group: str, case: str, ours: dict, theirs: dict) -> None:
    if (group, case) in DIFFERENCES:
        assert not _same(ours, theirs), f"{group} {case} now matches DeepSpeed: drop it from DIFFERENCES"
    else:
        assert _same(ours, theirs), f"{group} {case}: ds {ours}, DeepSpeed 0.19.8 {theirs}"


def test_record_is_deepspeed_0198():
    assert RECORD["deepspeed_version"] == "0.19.8"


def test_parse_args_names_and_defaults():
    for case in RECORD["parse_args"]:
        assert vars(runner.parse_args(case["args"])) == case["result"], case["args"]


def test_hostfile_parsing():
    for name, lines in RECORD["hostfiles"].items():
        _check(
            "parse_hostfile", name, _outcome(runner._parse_hostfile, lines), RECORD["parse_hostfile"][name]
        )
    assert runner.fetch_hostfile("/nonexistent/hostfile") is None
    assert RECORD["fetch_hostfile_missing"] == {"result": None}


def test_resource_filters_and_limits():
    pool = RECORD["pool"]
    for case in RECORD["parse_resource_filter"]:
        ours = _outcome(runner.parse_resource_filter, pool, case["include"], case["exclude"])
        _check("parse_resource_filter", f"{case['include']}|{case['exclude']}", ours, case)
    counts = {host: len(slots) for host, slots in pool.items()}
    for case in RECORD["parse_inclusion_exclusion"]:
        ours = _outcome(runner.parse_inclusion_exclusion, counts, case["include"], case["exclude"])
        _check("parse_inclusion_exclusion", case["include"], ours, case)
    for case in RECORD["apply_num_nodes_and_gpus"]:
        ours = _outcome(runner.apply_num_nodes_and_gpus, pool, case["num_nodes"], case["num_gpus"])
        _check("apply_num_nodes_and_gpus", str(case), ours, case)
    for spec, theirs in RECORD["parse_node_config"].items():
        _check("parse_node_config", spec, _outcome(runner.parse_node_config, spec), theirs)
    for spec, theirs in RECORD["parse_node_config_list"].items():
        _check("parse_node_config_list", spec, _outcome(runner.parse_node_config_list, spec), theirs)
    case = RECORD["encode_world_info"]
    assert runner.encode_world_info(case["world"]) == case["result"]


def test_main_refuses_what_deepspeed_refuses(tmp_path):
    (tmp_path / "two_hosts").write_text("worker-0 slots=2\nworker-1 slots=2\n")
    for name, case in RECORD["main_errors"].items():
        args = [str(tmp_path / Path(a).name) if a.startswith("/tmp") else a for a in case["args"]]
        _check("main", name, _outcome(runner.main, args), case)


def test_runner_classes():
    recorded = RECORD["runner_classes"]
    args = argparse.Namespace(
        user_args=["--a", "b c"], user_script="s.py", include="", exclude="", num_nodes=-1, num_gpus=-1,
        launcher_args="", hostfile="hf", ssh_port=None, no_python=False, module=False,
    )  # fmt: skip
    for cls_name in ("PDSHRunner", "OpenMPIRunner"):
        cls = getattr(multinode_runner, cls_name)
        ours = cls(args, "e30=") if cls_name == "PDSHRunner" else cls(args, "e30=", {"a": 1})
        for key, value in (("PLAIN", "v1"), ("SPACED", " a b "), ("QUOTE", 'x"y'), ("PATH", "/a:/b,c@d")):
            ours.add_export(key, value)
        assert {"name": ours.name, "exports": ours.exports} == recorded[cls_name]
    for key, change in (("include", {"include": "a"}), ("num_gpus", {"num_gpus": 2})):
        bad = argparse.Namespace(**{**vars(args), **change})
        ours = _outcome(multinode_runner.OpenMPIRunner, bad, "e30=", {"a": 1})
        _check("runner_classes", key, ours, recorded[f"OpenMPIRunner.{key}"])
    assert {k: v.__name__ for k, v in runner.LAUNCHER_CLASSES.items()} == RECORD["launcher_classes"]


def test_slurm_runner_runs_ds_launch_slurm_launcher():
    args = runner.parse_args(
        ["--launcher", "slurm", "-H", "hf", "--master_port", "29600", "train.py", "--lr", "1"]
    )
    slurm = multinode_runner.SlurmRunner(args, "e30=", {"a": 2, "b": 2})
    slurm.add_export("OMP_NUM_THREADS", "2")
    assert slurm.name == "slurm"
    cmd = slurm.get_cmd({}, {"a": [0, 1], "b": [0, 1]})
    hosts = runner.encode_world_info({"a": [0, 1], "b": [0, 1]})
    assert cmd[3:] == ["--launcher", "slurm", f"--resources={hosts}", "--master_port", "29600",
                       "--export=OMP_NUM_THREADS=2", "train.py", "--lr", "1"]  # fmt: skip
    with pytest.raises(ValueError, match="slurm backend cannot select specific device ids"):
        multinode_runner.SlurmRunner.validate_active_resources({"a": [1]})
    with pytest.raises(ValueError, match="slurm backend needs the same slot count on every host"):
        multinode_runner.SlurmRunner.validate_active_resources({"a": [0, 1], "b": [0]})


@pytest.mark.parametrize("name", ["IMPIRunner"])
def test_backends_ds_lacks_fail_naming_them(name):
    from deepspeed import FeatureNotAvailableError

    with pytest.raises(FeatureNotAvailableError, match=r"deepspeed --launcher \w+: the \w+ launcher is not"):
        getattr(multinode_runner, name)(argparse.Namespace(), "e30=", {})


def test_mpich_helper_fails_naming_it():
    from deepspeed import FeatureNotAvailableError
    from deepspeed.launcher import launcher_helper

    with pytest.raises(FeatureNotAvailableError, match="helper of its mpich launcher is not"):
        launcher_helper.main([])


def test_options_ds_lacks_fail_naming_them():
    from deepspeed import FeatureNotAvailableError

    for extra in (["--autotuning", "tune"], ["--enable_each_rank_log", "logs"]):
        option = extra[0]
        with pytest.raises(FeatureNotAvailableError, match=f"deepspeed {option}: .* is not available in ds"):
            runner.main([*extra, "x.py"])


def test_launch_module(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["launch.py", "train.py", "--x"])
    assert vars(launch.parse_args()) == RECORD["launch"]["parse_args"]
    monkeypatch.setattr(sys, "argv", ["launch.py", "train.py"])
    _check("launch", "main", _outcome(launch.main), RECORD["launch"]["main_without_world_info"])


def test_constants():
    home = os.path.expanduser("~")
    for module in (constants, runner, launch):
        for key, value in RECORD["constants"][module.__name__].items():
            if key == "DEEPSPEED_ENVIRONMENT_PATHS":
                value = [home, "."]  # the recording machine's home
            assert getattr(module, key) == value, f"{module.__name__}.{key}"
