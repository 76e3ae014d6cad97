"""Record the real ``deepspeed`` package's losses for integration/test_dropin.py (DeepSpeed-style scripts).

Runs each script of integration/scripts/dropin/ unchanged on 2 CPU ranks with the given DeepSpeed python and
writes integration/fixtures/deepspeed_dropin/<name>.json with the arguments, the config, the losses and the
DeepSpeed version. Scripts whose imports the DeepSpeed venv lacks (transformers) are skipped with a note.

    python tools/make_deepspeed_dropin_fixtures.py --deepspeed-python /work/venvs/deepspeed/bin/python [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_deepspeed_loss_fixtures import WORLD_SIZE, deepspeed_version, run_ranks  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "integration" / "scripts" / "dropin"
OUT = ROOT / "integration" / "fixtures" / "deepspeed_dropin"

_ADAM_WARMUP = {
    "optimizer": {"type": "Adam", "params": {"lr": 0.003, "weight_decay": 0.0}},
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.003, "warmup_num_steps": 4},
    },
    "gradient_clipping": 1.0,
    "steps_per_print": 1000,
}

# name -> (script, extra arguments, config passed as --deepspeed_config or None, --steps or None)
RUNS: dict[str, tuple[str, tuple[str, ...], dict | None, int | None]] = {
    "current_zero0_fp32": ("classifier_current.py", ("--stage", "0", "--dtype", "fp32"), None, None),
    "current_zero1_bf16": ("classifier_current.py", ("--stage", "1", "--dtype", "bf16"), None, None),
    "current_zero2_fp32": ("classifier_current.py", ("--stage", "2", "--dtype", "fp32"), None, None),
    "c2020_zero0_fp32": (
        "classifier_2020.py",
        (),
        {"train_batch_size": 32, "gradient_accumulation_steps": 2, **_ADAM_WARMUP},
        None,
    ),
    "c2020_zero2_bf16": (
        "classifier_2020.py",
        (),
        {
            "train_batch_size": 32,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": 2},
            **_ADAM_WARMUP,
        },
        None,
    ),
    "gan_zero0_fp32": (
        "gan_two_engines.py",
        (),
        {
            "train_batch_size": 16,
            "steps_per_print": 1000,
            "gradient_clipping": 1.0,  # explicit: DeepSpeed 0.19 defaults it to 1.0, the reference to 0
            "optimizer": {"type": "Adam", "params": {"lr": 0.002, "betas": [0.5, 0.999]}},
        },
        12,
    ),
    # HelloDeepSpeed's BERT shape: save with client state, a fresh engine loads and trains on ({tmp}: a new folder)
    "hello_bert_zero1_fp32": ("bert_hello.py", ("--stage", "1", "--checkpoint_dir", "{tmp}"), None, None),
    "bert_zero1_fp32": (
        "bert_mlm_hf.py",
        (),
        {
            "train_batch_size": 16,
            "gradient_accumulation_steps": 2,
            "zero_optimization": {"stage": 1},
            **_ADAM_WARMUP,
        },
        10,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed-python", default="/work/venvs/deepspeed/bin/python")
    parser.add_argument("names", nargs="*", help="record only these runs (default: all)")
    args = parser.parse_args()
    version = deepspeed_version(args.deepspeed_python)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (script, extra, config, steps) in RUNS.items():
        if args.names and name not in args.names:
            continue
        if (
            script == "bert_mlm_hf.py"
            and subprocess.run([args.deepspeed_python, "-c", "import transformers"]).returncode
        ):
            print(f"skipped {name}: transformers is not installed next to deepspeed")
            continue
        losses_file = OUT / f"{name}.losses.tmp"
        with tempfile.TemporaryDirectory() as tmp:
            given = tuple(a.replace("{tmp}", tmp) for a in extra)
            run_ranks(
                args.deepspeed_python, SCRIPTS / script, config, losses_file, steps=steps, extra_args=given
            )
        record = {
            "deepspeed_version": version,
            "world_size": WORLD_SIZE,
            "script": script,
            "args": list(extra) + (["--steps", str(steps)] if steps is not None else []),
            "config": config,
            **json.loads(losses_file.read_text()),
        }
        losses_file.unlink()
        (OUT / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {OUT / name}.json")


if __name__ == "__main__":
    main()
