"""Record what DeepSpeed 0.19.8 does when a script runs ``loss.backward()`` itself, then ``engine.step()``.

Run from the repository root with a Python that has deepspeed==0.19.8 installed (CPU accelerator):

    env -u PYTHONPATH DS_ACCELERATOR=cpu /work/refenv/bin/python tools/make_deepspeed_manual_backward_fixtures.py

Starts this script twice (ranks 0 and 1, gloo, as torchrun would) and writes
``packages/ds-engine/tests/fixtures/deepspeed_manual_backward.json``: at ZeRO stages 0 to 3, fp32, SGD, each
rank its own data, the weights after one step (or the exception) for ``engine.backward(loss)``, a plain
``loss.backward()``, ``engine.scale(loss).backward()`` and, with gradient accumulation 2, two plain
``loss.backward()`` before the boundary step. ``packages/ds-engine/tests/test_engine_step_guard.py`` reads it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "packages/ds-engine/tests/fixtures/deepspeed_manual_backward.json"
WAYS = ("engine_backward", "loss_backward", "scale_backward", "loss_backward_gas2")


def _net(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _one(deepspeed, torch, rank: int, stage: int, way: str):
    gas = 2 if way.endswith("gas2") else 1
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    engine = deepspeed.initialize(model=_net(torch), config=config)[0]
    try:
        for micro in range(gas):
            x = torch.full((2, 4), float(rank + 1 + micro))  # each rank (and micro-batch) its own data
            loss = engine(x).pow(2).mean()
            if way == "engine_backward":
                engine.backward(loss)
            elif way == "scale_backward":
                engine.scale(loss).backward()
            else:
                loss.backward()
            engine.step()
    except Exception as exc:  # noqa: BLE001 - recorded
        return {"error": f"{type(exc).__name__}: {exc}"}
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=stage == 3):
        return {"weights": [p.detach().flatten().tolist() for p in params]}


def _rank(out: str) -> None:
    import deepspeed
    import torch

    rank = int(os.environ["RANK"])
    got = {str(s): {w: _one(deepspeed, torch, rank, s, w) for w in WAYS} for s in range(4)}
    Path(out).write_text(json.dumps(got))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--rank":
        return _rank(sys.argv[2])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs, outs = [], []
    for rank in range(2):
        out = Path(tempfile.mkdtemp()) / f"rank{rank}.json"
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank)}
        env.update(WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", str(out)], env=env))
        outs.append(out)
    if any(p.wait(timeout=900) for p in procs):
        raise RuntimeError("the ranks failed")
    import deepspeed

    record = {"deepspeed": deepspeed.__version__}
    record.update({f"rank{r}": json.loads(o.read_text()) for r, o in enumerate(outs)})
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
