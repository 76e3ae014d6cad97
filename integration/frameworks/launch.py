"""Run a framework script under torchrun and collect the JSON lines rank 0 prints.

Shared by the tests here and by ``tools/fixtures/make_framework_fixtures.py`` (which runs the same scripts under
the real DeepSpeed), so both sides launch identically; the scripts import the config pieces they share
from here (their own folder is first on ``sys.path`` when Python runs them). Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_script(
    python: str,
    script: str,
    *args: str,
    nproc: int = 2,
    env: dict[str, str] | None = None,
    timeout_s: float = 600,
    launcher: list[str] | None = None,
) -> list[dict]:
    """``python -m torch.distributed.run --nproc_per_node nproc HERE/script args`` (or ``launcher`` given
    the script and args: another launcher's command line, e.g. ``deepspeed``); rank 0's JSON records."""
    cmd = [
        python, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_port", str(free_port()), str(HERE / script), *args,
    ]  # fmt: skip
    if launcher is not None:
        cmd = [*launcher, str(HERE / script), *args]
    full_env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=full_env)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return json_records(proc.stdout)


def json_records(text: str) -> list[dict]:
    """Every JSON object that starts a record in ``text``. The ranks share one stdout: another rank's output
    (a warning, a progress line) may sit on the same line before or after a record, so each record is
    decoded from its ``{"`` to its own end, whatever follows it."""
    decoder, records = json.JSONDecoder(), []
    for line in text.splitlines():
        start = line.find('{"')
        while start >= 0:
            try:
                record, end = decoder.raw_decode(line, start)
            except json.JSONDecodeError:
                start = line.find('{"', start + 1)
                continue
            records.append(record)
            start = line.find('{"', end)
    return records


def losses(records: list[dict]) -> list[float]:
    return [r["loss"] for r in records if "step" in r and "loss" in r]


def weights(records: list[dict]) -> dict[str, float] | None:
    found = [r["weights"] for r in records if "weights" in r]
    return found[-1] if found else None


def swap_files(nvme_path: Path) -> dict[str, dict[str, int]]:
    """The files under ``nvme_path``: per path (relative to it), its size and how many of its bytes are not
    zero (a file only reserved, e.g. by ``fallocate``, reads as zeros: non-zero bytes were written)."""
    found = {}
    for path in sorted(p for p in nvme_path.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found[str(path.relative_to(nvme_path))] = {"bytes": len(data), "nonzero": len(data) - data.count(0)}
    return found


def offload_to_nvme(zero_optimization: dict, out: str) -> None:
    """The scripts' ``--nvme`` (ZeRO-Infinity): the parameters and the optimizer state on ``nvme`` under
    ``out/nvme`` (created), every parameter partitioned (none persists in memory), small swap buffers for the
    tests' tiny models. Added to ``zero_optimization``, a DeepSpeed config's section, in place."""
    if zero_optimization["stage"] != 3:
        raise SystemExit("--nvme offloads the parameters too: ZeRO stage 3 only")
    nvme_path = Path(out) / "nvme"
    nvme_path.mkdir(parents=True, exist_ok=True)
    zero_optimization.update(
        stage3_param_persistence_threshold=0,
        offload_param={"device": "nvme", "nvme_path": str(nvme_path), "buffer_count": 4,
                       "buffer_size": 8192, "max_in_cpu": 0},
        offload_optimizer={"device": "nvme", "nvme_path": str(nvme_path), "buffer_count": 4},
    )  # fmt: skip


def assert_swapped_to_disk(nvme_path: Path, numel: int, ranks: int) -> None:
    """ds wrote each rank's parameter partitions and optimizer state into files under ``nvme_path``: every
    rank has a parameter file and optimizer files, and the parameter files hold at least the model's fp32
    values (``numel`` * 4 bytes, less 1% for bytes of a value that happen to be zero) in written, non-zero
    bytes, the optimizer files three times that (masters, exp_avg, exp_avg_sq)."""
    found = swap_files(nvme_path)
    assert found, f"no files under nvme_path {nvme_path}: the offload did not go to disk"
    by_kind: dict[str, int] = {"param": 0, "optimizer": 0}
    ranks_seen: dict[str, set[str]] = {"param": set(), "optimizer": set()}
    for name, seen in found.items():
        kind = "param" if name.startswith("ds_swap_params/") else "optimizer"
        by_kind[kind] += seen["nonzero"]
        ranks_seen[kind].add(Path(name).parent.name)
    every = {f"rank{r:05d}" for r in range(ranks)}
    assert ranks_seen == {"param": every, "optimizer": every}, sorted(found)
    assert by_kind["param"] >= 0.99 * 4 * numel, (by_kind, numel, found)
    assert by_kind["optimizer"] >= 0.99 * 3 * 4 * numel, (by_kind, numel, found)
