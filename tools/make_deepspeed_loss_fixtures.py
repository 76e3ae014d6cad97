"""Record the real ``deepspeed`` package's loss curves for integration/test_deepspeed_parity.py.

Runs integration/scripts/deepspeed_example.py (written for DeepSpeed) unchanged on 2 CPU ranks with the
given DeepSpeed python, for ZeRO stages 0, 1, 2 and 3 (fp32, Adam, WarmupLR; at stage 3 also with the optimizer, and with the
parameters and the optimizer, on NVMe), and writes
integration/fixtures/deepspeed_losses/<name>.json with the config, the losses and the DeepSpeed version.

    python tools/make_deepspeed_loss_fixtures.py --deepspeed-python /work/venvs/deepspeed/bin/python
(the venv: python3 -m venv V && V/bin/pip install torch==2.13.0 deepspeed==0.19.8; first run compiles ~2 min)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "integration" / "scripts" / "deepspeed_example.py"
OUT = ROOT / "integration" / "fixtures" / "deepspeed_losses"
WORLD_SIZE = 2
NVME_PATH = "@NVME_PATH@"


def parity_configs() -> dict[str, dict]:
    """The configs compared; gradient_clipping is explicit because DeepSpeed 0.19 defaults it to 1.0."""
    base = {
        "train_batch_size": 16,
        "gradient_accumulation_steps": 2,
        "steps_per_print": 100,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "Adam", "params": {"lr": 0.01, "weight_decay": 0.01}},
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 5},
        },
    }
    configs = {
        f"zero{stage}_fp32_adam_warmuplr": {**base, "zero_optimization": {"stage": stage}}
        for stage in (0, 1, 2, 3)
    }
    # ZeRO-Infinity's optimizer half: masters and Adam state in swap files under nvme_path (a fresh temporary
    # directory replaces NVME_PATH at recording and at test time)
    nvme = {"device": "nvme", "nvme_path": NVME_PATH, "buffer_count": 4, "pipeline_read": True,
            "pipeline_write": True}  # fmt: skip
    configs["zero3_fp32_adam_warmuplr_nvme"] = {
        **base,
        "zero_optimization": {"stage": 3, "sub_group_size": 2000, "offload_optimizer": nvme},
        "aio": {"block_size": 262144, "queue_depth": 8, "thread_count": 2, "single_submit": False,
                "overlap_events": True},
    }  # fmt: skip
    # ZeRO-Infinity whole: the parameter partitions in swap files too (max_in_cpu 0: none kept in memory;
    # buffer_size covers the largest parameter, fc2's 4096 weights). Checked with strace on 2026-12-06:
    # DeepSpeed 0.19.8 on the CPU accelerator reports params_in_nvme_and_cpu and swap_optimizer True and
    # creates zero_stage_3/{bfloat16params,optimizer}/rank*/ under nvme_path, but opens no file there for
    # this model (and records no swap_files below): the fixture is DeepSpeed's losses for this config, not
    # evidence that DeepSpeed's bytes went through the disk
    configs["zero3_fp32_adam_warmuplr_nvme_params"] = {
        **configs["zero3_fp32_adam_warmuplr_nvme"],
        "zero_optimization": {
            "stage": 3,
            "sub_group_size": 2000,
            "stage3_param_persistence_threshold": 0,
            "offload_optimizer": nvme,
            "offload_param": {"device": "nvme", "nvme_path": NVME_PATH, "buffer_count": 6, "buffer_size": 8192,
                              "max_in_cpu": 0},
        },
    }  # fmt: skip
    return configs


def with_nvme_path(config: dict, path: str) -> dict:
    """``config`` with the NVME_PATH placeholder replaced by ``path``."""
    return json.loads(json.dumps(config).replace(NVME_PATH, path))


def run_ranks(
    python: str,
    script: Path,
    config: dict | None,
    out: Path,
    steps: int | None = 20,
    timeout_s: float = 1800,
    extra_args: tuple[str, ...] = (),
) -> None:
    """Start ``WORLD_SIZE`` ranks of ``script`` with launcher environment variables, as torchrun would.

    ``config`` None passes no ``--deepspeed_config`` (a script that builds its own), ``steps`` None no ``--steps``.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
    argv = [str(script), "--out", str(out), *extra_args]
    argv += ["--deepspeed_config", f.name] if config is not None else []
    argv += ["--steps", str(steps)] if steps is not None else []
    procs = []
    for rank in range(WORLD_SIZE):
        env = {
            **os.environ,
            "DS_ACCELERATOR": "cpu",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(WORLD_SIZE),
            "LOCAL_WORLD_SIZE": str(WORLD_SIZE),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(subprocess.Popen([python, *argv], env=env))
    codes = [p.wait(timeout=timeout_s) for p in procs]
    os.unlink(f.name)
    if any(codes):
        raise RuntimeError(f"{script.name} ranks exited with {codes}")


def deepspeed_version(python: str) -> str:
    """The version string of the deepspeed package importable by ``python``."""
    return (
        subprocess.run(
            [python, "-c", "import deepspeed; print(deepspeed.__version__)"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "DS_ACCELERATOR": "cpu"},
        )
        .stdout.strip()
        .splitlines()[-1]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed-python", default="/work/venvs/deepspeed/bin/python")
    parser.add_argument("--only", nargs="*", default=None, help="fixture names to (re)record; default all")
    args = parser.parse_args()
    version = deepspeed_version(args.deepspeed_python)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, config in parity_configs().items():
        if args.only is not None and name not in args.only:
            continue
        losses_file = OUT / f"{name}.losses.tmp"
        with tempfile.TemporaryDirectory(prefix="ds-nvme-fixture-") as nvme:
            run_ranks(args.deepspeed_python, SCRIPT, with_nvme_path(config, nvme), losses_file)
            # what DeepSpeed left under nvme_path: evidence that the offload went to disk
            swap_files = sorted(str(p.relative_to(nvme)) for p in Path(nvme).rglob("*") if p.is_file())
        record = {
            "deepspeed_version": version,
            "world_size": WORLD_SIZE,
            "config": config,
            **({"swap_files": swap_files} if swap_files else {}),
            **json.loads(losses_file.read_text()),
        }
        losses_file.unlink()
        (OUT / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {OUT / name}.json")


if __name__ == "__main__":
    main()
