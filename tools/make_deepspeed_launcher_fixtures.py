"""Record what DeepSpeed 0.19.8's launcher modules return and raise, for ds's ``deepspeed.launcher`` to match.

Run from the repository root with a Python that has deepspeed==0.19.8 installed (CPU accelerator):

    env -u PYTHONPATH DS_ACCELERATOR=cpu /work/refenv/bin/python tools/make_deepspeed_launcher_fixtures.py

Writes ``packages/deepspeed/tests/fixtures/deepspeed_launcher.json``, which
``packages/deepspeed/tests/test_launcher.py`` compares ds against: ``runner.parse_args`` (defaults and a
full command line), the hostfile parser, ``parse_node_config(_list)``, ``parse_resource_filter``,
``parse_inclusion_exclusion``, ``apply_num_nodes_and_gpus``, ``encode_world_info``, the errors ``main``
raises before it launches anything, the runner classes' names, export quoting and argument checks,
``launch.parse_args`` and its ``world_info`` check, and the modules' constants. Each case is the call's
arguments with its result, or the exception's class hierarchy and message. Nothing is launched.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "packages/deepspeed/tests/fixtures/deepspeed_launcher.json"

HOSTFILES = {
    "two_hosts": ["worker-0 slots=4\n", "worker-1 slots=2\n"],
    "comments_blank": ["# a comment\n", "\n", "a slots=1\n", "  b slots=8  \n"],
    "trailing_field": ["a slots=2 max_slots=4\n"],
    "bad_entry": ["worker-0 slots=4\n", "worker-1 slot=4\n"],
    "no_slots": ["worker-0\n"],
    "duplicate": ["a slots=1\n", "a slots=2\n"],
    "empty": [],
    "only_comment": ["# nothing\n"],
    "slots_suffix": ["worker-0 slots=4x\n"],
}
POOL = {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1], "worker-2": [0, 1, 2, 3]}
FILTERS = [
    ("", ""),
    ("worker-0", ""),
    ("worker-1:0", ""),
    ("worker-0:1,3@worker-2", ""),
    ("worker-2@worker-0", ""),
    ("worker-0:0@worker-0:2", ""),
    ("worker-0:2,0,2", ""),
    ("", "worker-1"),
    ("", "worker-0:0,1"),
    ("", "worker-0@worker-1@worker-2"),
    ("worker-0", "worker-1"),
    ("worker-9", ""),
    ("", "worker-9:0"),
    ("worker-1:5", ""),
    ("", "worker-1:0,7"),
    ("worker-0@worker-0:1", ""),
    ("worker-0:x", ""),
]
LIMITS = [(-1, -1), (1, -1), (-1, 2), (2, 1)]
PARSE_ARGS = [
    ["train.py"],
    ["--num_gpus", "2", "--num_nodes", "1", "-H", "hf", "--master_port", "1234", "--master_addr", "10.0.0.1",
     "--launcher", "OpenMPI", "--launcher_args", "--x y", "--module", "--no_python", "--no_local_rank",
     "--force_multi", "--ssh_port", "2222", "train", "--lr", "1", "--local_rank=0"],
    ["--num_accelerators", "3", "-i", "a:0@b", "s.py"],
]  # fmt: skip


def _error(exc: BaseException) -> dict:
    return {"error": {"mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}}


def _call(fn, *args, **kwargs) -> dict:
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - the class is what is recorded
        return _error(exc)
    return {"result": json.loads(json.dumps(result, default=lambda o: repr(o)))}


def _main_errors(runner, tmp: Path) -> dict:
    two = tmp / "two_hosts"
    two.write_text("worker-0 slots=2\nworker-1 slots=2\n")
    cases = {
        "unknown_launcher": ["-H", str(two), "--no_ssh_check", "--master_addr", "10.0.0.1", "--launcher", "foo",
                             "x.py"],
        "num_gpus_with_include": ["-H", str(two), "--num_gpus", "1", "-i", "worker-0", "x.py"],
        "no_hostfile_num_nodes": ["-H", str(tmp / "missing"), "--num_nodes", "2", "x.py"],
        "openmpi_with_include": ["-H", str(two), "--no_ssh_check", "--master_addr", "10.0.0.1", "--launcher",
                                 "openmpi", "-i", "worker-0@worker-1", "x.py"],
        "openmpi_with_num_gpus": ["-H", str(two), "--no_ssh_check", "--master_addr", "10.0.0.1", "--launcher",
                                  "openmpi", "--num_gpus", "1", "x.py"],
    }  # fmt: skip
    return {name: {"args": args, **_call(runner.main, args)} for name, args in cases.items()}


def _runner_classes(multinode_runner) -> dict:
    args = argparse.Namespace(
        user_args=["--a", "b c"], user_script="s.py", include="", exclude="", num_nodes=-1, num_gpus=-1,
        launcher_args="", hostfile="hf", ssh_port=None, no_python=False, module=False,
    )  # fmt: skip
    got = {}
    for cls_name in ("PDSHRunner", "OpenMPIRunner"):
        cls = getattr(multinode_runner, cls_name)
        runner = cls(args, "e30=") if cls_name == "PDSHRunner" else cls(args, "e30=", {"a": 1})
        for key, value in (("PLAIN", "v1"), ("SPACED", " a b "), ("QUOTE", 'x"y'), ("PATH", "/a:/b,c@d")):
            runner.add_export(key, value)
        got[cls_name] = {"name": runner.name, "exports": runner.exports}
    inc = argparse.Namespace(**{**vars(args), "include": "a"})
    gpus = argparse.Namespace(**{**vars(args), "num_gpus": 2})
    got["OpenMPIRunner.include"] = _call(multinode_runner.OpenMPIRunner, inc, "e30=", {"a": 1})
    got["OpenMPIRunner.num_gpus"] = _call(multinode_runner.OpenMPIRunner, gpus, "e30=", {"a": 1})
    return got


def _launch(launch) -> dict:
    saved = sys.argv
    try:
        sys.argv = ["launch.py", "train.py", "--x"]
        defaults = vars(launch.parse_args())
        sys.argv = ["launch.py", "train.py"]
        missing_world = _call(launch.main)
    finally:
        sys.argv = saved
    return {"parse_args": defaults, "main_without_world_info": missing_world}


def _constants(module) -> dict:
    found = {}
    for key, value in vars(module).items():
        try:
            found[key] = json.loads(json.dumps(value)) if key.isupper() else None
        except TypeError:
            continue  # a class table (LAUNCHER_CLASSES): recorded by name elsewhere
    return {k: v for k, v in found.items() if k.isupper()}


def main() -> None:
    import deepspeed
    from deepspeed.launcher import constants, launch, multinode_runner, runner

    record: dict = {"deepspeed_version": deepspeed.__version__}
    record["parse_args"] = [{"args": a, **_call(lambda a=a: vars(runner.parse_args(a)))} for a in PARSE_ARGS]
    record["parse_hostfile"] = {k: _call(runner._parse_hostfile, v) for k, v in HOSTFILES.items()}
    record["hostfiles"] = HOSTFILES
    with tempfile.TemporaryDirectory() as tmp:
        record["fetch_hostfile_missing"] = _call(runner.fetch_hostfile, str(Path(tmp) / "missing"))
        record["main_errors"] = _main_errors(runner, Path(tmp))
    record["pool"] = POOL
    record["parse_resource_filter"] = [
        {"include": inc, "exclude": exc, **_call(runner.parse_resource_filter, POOL, inc, exc)}
        for inc, exc in FILTERS
    ]
    counts = {host: len(slots) for host, slots in POOL.items()}
    record["parse_inclusion_exclusion"] = [
        {"include": inc, "exclude": exc, **_call(runner.parse_inclusion_exclusion, counts, inc, exc)}
        for inc, exc in FILTERS[:6]
    ]
    record["parse_node_config"] = {s: _call(runner.parse_node_config, s) for s in ("a", "a:0,2", "a:3")}
    record["parse_node_config_list"] = {
        s: _call(runner.parse_node_config_list, s) for s in ("a@b:1", "a:2@a:0,2@b", "a@a:1")
    }
    record["apply_num_nodes_and_gpus"] = [
        {"num_nodes": n, "num_gpus": g, **_call(runner.apply_num_nodes_and_gpus, POOL, n, g)}
        for n, g in LIMITS
    ]
    record["encode_world_info"] = {
        "world": {"a": [0, 1], "b": [2]},
        **_call(runner.encode_world_info, {"a": [0, 1], "b": [2]}),
    }
    record["runner_classes"] = _runner_classes(multinode_runner)
    record["launcher_classes"] = {k: v.__name__ for k, v in runner.LAUNCHER_CLASSES.items()}
    record["launch"] = _launch(launch)
    record["constants"] = {
        "deepspeed.launcher.constants": _constants(constants),
        "deepspeed.launcher.runner": _constants(runner),
        "deepspeed.launcher.launch": _constants(launch),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
