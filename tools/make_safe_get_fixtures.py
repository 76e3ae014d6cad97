"""Record what DeepSpeed 0.19.8's ``deepspeed.utils.safe_get_*`` / ``safe_set_*`` return at ZeRO 0-3.

Run from the repository root with the Python of a venv that has torch 2.13.0 and deepspeed==0.19.8:

    python tools/make_safe_get_fixtures.py --deepspeed-python /work/refenv/bin/python

Writes ``packages/ds-engine/tests/fixtures/deepspeed_safe_get.json``, which
``packages/ds-engine/tests/test_safe_get.py`` compares ds against. For each case (ZeRO stage, dtype) two
CPU ranks (gloo) run the sequence of ``SCRIPT`` on a tiny model and record, at each point, per parameter:
the returned value (shape, dtype, values, or None) or the exception (class, message), and whether both
ranks got the same. A case DeepSpeed cannot run on CPU is recorded as ``not_run`` with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "packages/ds-engine/tests/fixtures/deepspeed_safe_get.json"
WORLD_SIZE = 2
CASES = {"zero0_fp32": (0, "fp32"), "zero1_fp32": (1, "fp32"), "zero2_fp32": (2, "fp32"),
         "zero3_fp32": (3, "fp32"), "zero0_bf16": (0, "bf16"), "zero2_bf16": (2, "bf16")}  # fmt: skip
LR, WEIGHT_DECAY = 0.05, 0.01


def build_model(torch):
    """26 trainable elements: not a multiple of 2 * world size, and 0.weight straddles the partitions."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def batch(torch, step: int, rank: int):
    """Rank ``rank``'s ``(x, y)`` of step ``step`` (the same for DeepSpeed, ds and the torch reference)."""
    g = torch.Generator().manual_seed(1000 + 10 * step + rank)
    return torch.randn(2, 3, generator=g), torch.randn(2, 2, generator=g)


def set_values(torch, shape):
    """The values the script writes with the setters: fp32 weights, exp_avg, exp_avg_sq, gradient."""
    n = int(torch.Size(shape).numel())
    ramp = torch.linspace(-1.0, 1.0, n).view(shape)
    return {"fp32": ramp * 0.5, "exp_avg": ramp * 0.01, "exp_avg_sq": ramp.abs() * 1e-3 + 1e-4, "grad": ramp}


def config(stage: int, dtype: str) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,  # explicit: DeepSpeed 0.19.8 would clip at 1.0 without it
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1000,
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


SET_PARAM = "0.weight"  # the parameter the setters write


def script(deepspeed, torch, engine, record) -> None:
    """The sequence each case runs; ``record(point)`` reads every getter for every parameter."""
    from deepspeed import utils as u

    rank = torch.distributed.get_rank()
    dtype = next(engine.module.parameters()).dtype

    def train_backward(step):
        x, y = batch(torch, step, rank)
        loss = torch.nn.functional.mse_loss(engine(x.to(dtype)).float(), y)
        engine.backward(loss)

    record("init")
    train_backward(0)
    record("after_backward")
    engine.step()
    record("after_step")
    param = dict(engine.module.named_parameters())[SET_PARAM]
    values = set_values(torch, _shape(param))
    _try(lambda: u.safe_set_full_fp32_param(param, values["fp32"]))
    _try(lambda: u.safe_set_full_optimizer_state(param, values["exp_avg"], "exp_avg"))
    _try(lambda: u.safe_set_full_optimizer_state(param, values["exp_avg_sq"], "exp_avg_sq"))
    record("after_set")
    train_backward(1)
    _try(lambda: u.safe_set_full_grad(param, values["grad"]))
    record("after_set_grad")
    engine.step()
    record("after_second_step")


def _shape(param):
    return tuple(getattr(param, "ds_shape", param.shape))


def _try(fn):
    try:
        return {"value": fn()}
    except BaseException as exc:  # noqa: BLE001 - the class and message are what is recorded
        return {"error": type(exc).__name__, "message": str(exc)[:300]}


def _describe(torch, got: dict) -> dict:
    if "error" in got:
        return got
    value = got["value"]
    if value is None:
        return {"none": True}
    t = value.detach()
    return {
        "shape": list(t.shape),
        "dtype": str(t.dtype).replace("torch.", ""),
        "values": t.float().reshape(-1).tolist(),
    }


def _read_all(torch, u, p, stage: int) -> dict:
    """Every getter's outcome for ``p``; the full ones are collective (both ranks read the same parameters)."""
    fragment = getattr(p, "_hp_mapping", None)
    rec = {
        "param_grad_is_none": p.grad is None,
        "full_grad": _collective(
            torch,
            fragment,
            lambda: fragment.get_lp_grad_fragment(p._index_in_param_group),
            lambda: u.safe_get_full_grad(p),
        ),
        "full_fp32_param": _collective(
            torch, fragment, lambda: fragment.get_hp_fragment(), lambda: u.safe_get_full_fp32_param(p)
        ),
    }
    for key in ("exp_avg", "exp_avg_sq"):
        rec[key] = _collective(
            torch,
            fragment,
            lambda k=key: fragment.get_hp_fragment(k),
            lambda k=key: u.safe_get_full_optimizer_state(p, k),
        )
    rec["local_fp32_param"] = _describe(torch, _try(lambda: u.safe_get_local_fp32_param(p)))
    rec["local_grad"] = _describe(torch, _try(lambda: u.safe_get_local_grad(p)))
    if stage < 3:
        rec["module_param"] = _describe(torch, {"value": p.detach()})
    return rec


def _collective(torch, fragment, probe, read) -> dict:
    """``read()`` (a collective getter), unless ``probe()`` raises on a rank that holds a fragment of the
    parameter (ZeRO 1/2): DeepSpeed then raises on that rank only and leaves the others waiting in the
    all-reduce, so the error is recorded (from whichever rank raised) instead of calling it."""
    local = _try(probe) if fragment is not None else {}
    errors = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(errors, local.get("error") and local)
    raised = [e for e in errors if e]
    if raised:
        return {**raised[0], "on_owning_ranks_only": True}
    return _describe(torch, _try(read))


def _worker(stage: int, dtype: str, out: str) -> None:
    import faulthandler

    import deepspeed
    import torch
    from deepspeed import utils as u

    faulthandler.dump_traceback_later(840, exit=True)  # a collective one rank never joins: say where
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    model = build_model(torch)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config(stage, dtype))
    points: dict = {}

    def record(point: str) -> None:
        points[point] = {name: _read_all(torch, u, p, stage) for name, p in engine.module.named_parameters()}

    script(deepspeed, torch, engine, record)
    Path(out).write_text(json.dumps({"rank": rank, "points": points}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_case(python: str, stage: int, dtype: str) -> dict:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs, outs, logs = [], [], []
        for rank in range(WORLD_SIZE):
            env = dict(os.environ, DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE),
                       LOCAL_WORLD_SIZE=str(WORLD_SIZE), OMP_NUM_THREADS="1")  # fmt: skip
            outs.append(Path(tmp) / f"rank{rank}.json")
            cmd = [python, __file__, "--worker", str(stage), dtype, str(outs[-1])]
            logs.append(Path(tmp) / f"rank{rank}.log")  # a file, not a pipe: a full pipe would block the rank
            with logs[-1].open("w") as log:
                procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        results = [(p.wait(timeout=900), log.read_text()) for p, log in zip(procs, logs)]
        if any(code for code, _ in results) or not all(o.exists() for o in outs):
            return {"not_run": results[0][1][-800:]}
        ranks = [json.loads(o.read_text())["points"] for o in outs]
    for point, params in ranks[0].items():  # full getters must agree on every rank
        for name, got in params.items():
            for key, value in got.items():
                if isinstance(value, dict) and not key.startswith("local"):
                    value_other = ranks[1][point][name][key]
                    got[key] = {**value, "same_on_ranks": value == value_other}
    return {"points": ranks[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed-python", default="/work/refenv/bin/python")
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), help="cases to record (default: all)")
    parser.add_argument("--worker", nargs=3, metavar=("STAGE", "DTYPE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        stage, dtype, out = args.worker
        _worker(int(stage), dtype, out)
        return
    version = subprocess.run([args.deepspeed_python, "-c", "import deepspeed; print(deepspeed.__version__)"],
                             env=dict(os.environ, DS_ACCELERATOR="cpu"), capture_output=True, text=True)  # fmt: skip
    record = {"deepspeed": version.stdout.strip().splitlines()[-1], "set_param": SET_PARAM, "lr": LR,
              "weight_decay": WEIGHT_DECAY, "cases": {}}  # fmt: skip
    for name in args.only or CASES:
        stage, dtype = CASES[name]
        record["cases"][name] = {
            "stage": stage,
            "dtype": dtype,
            **_run_case(args.deepspeed_python, stage, dtype),
        }
        print(name, "not run" if "not_run" in record["cases"][name] else "recorded", flush=True)
    OUT.write_text(json.dumps(record, separators=(",", ":")) + "\n")  # compact: 6 cases of per-point values
    print(f"wrote {OUT}")


if __name__ == "__main__":
    sys.exit(main())
