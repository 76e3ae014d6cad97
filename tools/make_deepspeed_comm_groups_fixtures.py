"""Record what DeepSpeed 0.19.8's comm, groups, accelerator and three engine methods do at 2 gloo ranks.

Run from the repository root with the real DeepSpeed (CPU accelerator):

    env -u PYTHONPATH DS_ACCELERATOR=cpu /work/refenv/bin/python tools/make_deepspeed_comm_groups_fixtures.py

Writes ``packages/deepspeed/tests/fixtures/deepspeed_comm_groups.json`` (read by
``packages/deepspeed/tests/test_comm_groups.py``), per rank: ``deepspeed.comm``'s ``all_gather_coalesced``
(outputs and return value), a ``P2POp`` exchange through ``batch_isend_irecv``, ``ProcessGroup``'s fields,
the ``TORCH_DISTRIBUTED_DEFAULT_PORT``; ``deepspeed.utils.groups``' getters (public and the private ones
published code calls) before and after ``deepspeed.initialize``, and ``groups.initialize``; the accelerator's
``isinstance`` with ``DeepSpeedAccelerator`` and ``set_accelerator`` of a non-accelerator; and the engine's
``scale(loss)``, ``communication_data_type`` and ``get_wall_clock_timers()`` on an fp32 and a bf16 engine.
A value that raises is recorded as ``{"raises": class name, "message": text}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "packages/deepspeed/tests/fixtures/deepspeed_comm_groups.json"

PUBLIC_GETTERS = (
    "get_data_parallel_group get_data_parallel_rank get_data_parallel_world_size get_model_parallel_group "
    "get_model_parallel_rank get_model_parallel_world_size get_tensor_model_parallel_group "
    "get_tensor_model_parallel_rank get_tensor_model_parallel_world_size get_tensor_model_parallel_src_rank"
).split()
# private getters DeepSpeed's own engine and published code (Megatron-DeepSpeed, transformers' SP) call
PRIVATE_GETTERS = (
    "_get_data_parallel_world_size _get_data_parallel_rank _get_model_parallel_world_size _get_broadcast_src_rank "
    "_get_sequence_parallel_world_size _get_sequence_parallel_rank _get_sequence_data_parallel_world_size "
    "_get_sequence_data_parallel_rank _get_expert_model_parallel_world_size"
).split()
CONFIGS = {
    "fp32_zero0": {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
    },
    "bf16_zero1": {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1},
    },
    "fp32_zero0_wall_clock": {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "wall_clock_breakdown": True,
    },
}
LOSS_X = [[0.5, -1.0, 2.0, 0.25], [1.5, 0.5, -0.5, 1.0]]


def _value(fn):
    """What ``fn()`` returns as JSON (a process group as its ranks), or what it raises."""
    import torch.distributed as dist

    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - what it raises is what is recorded
        return {"raises": type(exc).__name__, "message": str(exc)}
    if isinstance(out, dist.ProcessGroup):
        return {"group ranks": dist.get_process_group_ranks(out)}
    return out


def _comm(rank: int) -> dict:
    import deepspeed.comm as dist
    import torch

    out: dict = {"TORCH_DISTRIBUTED_DEFAULT_PORT": dist.TORCH_DISTRIBUTED_DEFAULT_PORT}
    inputs = [torch.full((3,), float(rank + 1)), torch.arange(2, dtype=torch.float32) + 10 * rank]
    outputs = [torch.zeros(6), torch.zeros(4)]
    # DeepSpeed 0.19.8 coalesces through torch's coalescing manager, which gloo lacks: recorded as raised
    out["all_gather_coalesced"] = _value(lambda: repr(dist.all_gather_coalesced(outputs, inputs)))
    out["all_gather_coalesced outputs"] = [t.tolist() for t in outputs]
    peer = 1 - rank
    send, recv = torch.full((2,), float(rank + 7)), torch.zeros(2)
    ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    out["P2POp exchange"] = recv.tolist()
    out["P2POp bad op"] = _value(lambda: dist.P2POp(dist.all_reduce, send, peer))
    pg = dist.ProcessGroup(5, [0, 1])
    out["ProcessGroup"] = {"comm_id": pg.comm_id, "ranks": pg.ranks, "size": pg.size}
    out["ProcessGroup default"] = {"ranks": dist.ProcessGroup(3).ranks, "size": dist.ProcessGroup(3).size}
    out["comm.comm is the package's"] = dist.comm.all_reduce is dist.all_reduce
    return out


def _groups() -> dict:
    from deepspeed.utils import groups

    got = {name: _value(getattr(groups, name)) for name in PUBLIC_GETTERS + PRIVATE_GETTERS}
    got["_get_data_parallel_group"] = _value(groups._get_data_parallel_group)
    got["_get_sequence_parallel_group"] = _value(groups._get_sequence_parallel_group)
    got["initialize()"] = _value(groups.initialize)
    got["initialize(ep_size=2)"] = _value(lambda: groups.initialize(ep_size=2))
    return got


def _accelerator() -> dict:
    from deepspeed.accelerator import DeepSpeedAccelerator, get_accelerator, real_accelerator, set_accelerator

    accel = get_accelerator()
    out = {
        "isinstance DeepSpeedAccelerator": isinstance(accel, DeepSpeedAccelerator),
        "real_accelerator.get_accelerator is the package's": real_accelerator.get_accelerator
        is get_accelerator,
        "is_current_accelerator_supported": real_accelerator.is_current_accelerator_supported(),
        "set_accelerator(object())": _value(lambda: set_accelerator(object())),
        "DeepSpeedAccelerator()": _value(DeepSpeedAccelerator),
    }
    set_accelerator(accel)
    out["after set_accelerator(same) get_accelerator is it"] = get_accelerator() is accel
    return out


def _timers(engine) -> dict:
    """The snapshot's names, each with whether it measured any time (the milliseconds themselves vary)."""
    return {name: ms > 0 for name, ms in sorted(engine.get_wall_clock_timers().items())}


def _engines() -> dict:
    import deepspeed
    import torch

    out = {}
    for name, config in CONFIGS.items():
        torch.manual_seed(0)
        dtype = torch.bfloat16 if config.get("bf16") else torch.float32
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        case = {"communication_data_type": str(engine.communication_data_type)}
        case["get_wall_clock_timers() before a step"] = engine.get_wall_clock_timers()
        loss = engine(torch.tensor(LOSS_X, dtype=dtype)).float().pow(2).mean()
        scaled = engine.scale(loss)
        case["scale(loss) / loss"] = (scaled / loss).item()
        case["scale(loss) requires grad"] = scaled.requires_grad
        case["scale(no grad_fn)"] = _value(lambda: engine.scale(torch.tensor(1.0)))  # noqa: B023 - called at once
        # (with wall_clock_breakdown, a refused direct backward would leave DeepSpeed's timers running)
        if not config.get("wall_clock_breakdown"):
            case["scale(loss).backward()"] = _value(scaled.backward)
        if case.get("scale(loss).backward()", "skipped") is not None:  # refused or skipped: engine.backward
            engine.backward(engine(torch.tensor(LOSS_X, dtype=dtype)).float().pow(2).mean())
        engine.step()
        case["get_wall_clock_timers() after a step"] = _timers(engine)
        engine.backward(engine(torch.tensor(LOSS_X, dtype=dtype)).float().pow(2).mean())
        engine.step()
        case["get_wall_clock_timers() after engine.backward and step"] = _timers(engine)
        case["groups after initialize"] = _groups()
        out[name] = case
        engine.destroy()
    return out


def _runtime_utils() -> dict:
    """``deepspeed.runtime.utils``' helpers: what ``set_random_seed`` makes the generators draw, and what
    ``move_to_device`` returns (structure, and whether a tensor the criterion accepts is the same object)."""
    import random

    import numpy
    import torch
    from deepspeed.runtime.utils import move_to_device, set_random_seed

    out = {}
    for seed in (1234, 2**40 + 5, 2**70 + 3):
        set_random_seed(seed)
        out[f"set_random_seed({seed})"] = [
            random.random(),
            float(numpy.random.rand()),
            torch.rand(2).tolist(),
        ]
    a, b = torch.ones(2, dtype=torch.float64), torch.zeros(1)
    moved = move_to_device({"x": [a, (b, a)], "y": b}, "cpu")
    out["move_to_device nested"] = {
        "types": [type(moved).__name__, type(moved["x"]).__name__, type(moved["x"][1]).__name__],
        "same objects": [moved["x"][0] is a, moved["y"] is b],
    }
    kept = move_to_device(
        [a, b], "cpu", criterion_func=lambda t: isinstance(t, torch.Tensor) and t.dtype == torch.float64
    )
    out["move_to_device criterion"] = {"same objects": [kept[0] is a, kept[1] is b]}
    out["move_to_device int"] = _value(lambda: move_to_device(3, "cpu"))
    return out


def _rank(rank: int, world_size: int) -> dict:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    return {
        "groups before initialize": _groups(),
        "comm": _comm(rank),
        "accelerator": _accelerator(),
        "engines": _engines(),
    }


def main() -> None:
    sys.path.insert(0, str(ROOT / "testing"))
    import deepspeed
    from rank_testing import spawn

    results = spawn(_rank, 2, timeout_s=600)
    out = {
        "deepspeed": deepspeed.__version__,
        "world_size": 2,
        "ranks": results,
        "runtime.utils": _runtime_utils(),
    }
    OUT.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main()
