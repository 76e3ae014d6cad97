"""OneBitAdam: sign packing, the compressed all-reduce, bytes on the wire, and training on real processes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from ds_optim import OneBitAdam, build_optimizer
from ds_optim._onebit import _Layout, pack_signs, unpack_signs
from rank_testing import spawn


def test_pack_unpack_signs_round_trip_zero_is_positive():
    x = torch.tensor([[1.0, -2.0, 0.0, -0.0, 3.0, -1e-9, 5.0, -7.0] * 2])
    packed = pack_signs(x >= 0)
    assert packed.dtype == torch.uint8 and packed.shape == (1, 2)
    assert packed[0, 0].item() == 0b10111010
    assert torch.equal(unpack_signs(packed), x >= 0)


def test_pack_unpack_every_byte_and_batched_rows():
    every_byte = torch.arange(256, dtype=torch.uint8)
    bits = torch.tensor([[(b >> (7 - k)) & 1 for k in range(8)] for b in range(256)], dtype=torch.bool)
    assert torch.equal(pack_signs(bits), every_byte.view(256, 1))
    assert torch.equal(unpack_signs(every_byte.view(256, 1)), bits)
    rows = torch.randn(3, 64) >= 0
    assert torch.equal(unpack_signs(pack_signs(rows)), rows)


def test_layout_pads_to_world_times_lcm_and_round_trips():
    tensors = [torch.randn(3, 5), torch.randn(100), torch.randn(1)]
    layout = _Layout.build([t.numel() for t in tensors], world_size=3)
    assert layout.chunks == [24, 48, 24]  # lcm(3, 8) = 24; each tensor padded to a multiple of 3 * 24
    buf = torch.empty(3, layout.columns)
    layout.gather(tensors, buf)
    out = [torch.empty_like(t) for t in tensors]
    layout.scatter(buf, out)
    assert all(torch.equal(a, b) for a, b in zip(out, tensors))
    assert buf[:, 15:24].abs().sum() == 0 and buf[0, 15:24].numel() == 9  # padding is zeros


def test_onebit_needs_torch_distributed_and_known_backend():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="nccl, gloo, mpi"):
        OneBitAdam(p, comm_backend_name="hccl")
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            OneBitAdam(p, comm_backend_name="gloo")


def _compressed_mean(rank: int, world: int) -> dict:
    """Time-average of the compressed all-reduce of fixed per-rank inputs converges to their mean."""
    gen = torch.Generator().manual_seed(100 + rank)
    inputs = [torch.randn(37, 11, generator=gen), torch.randn(5, generator=gen) * 10]
    params = [torch.nn.Parameter(torch.zeros_like(x)) for x in inputs]
    opt = OneBitAdam(params, comm_backend_name="gloo")
    total = [torch.zeros_like(x) for x in inputs]
    rounds = 100
    for _ in range(rounds):
        buf = [x.clone() for x in inputs]
        opt._compressed_allreduce(0, buf)
        for t, b in zip(total, buf):
            t += b
    true_mean = [x.clone() for x in inputs]
    for x in true_mean:
        dist.all_reduce(x)
        x /= world
    return {
        "avg": [t / rounds for t in total],
        "mean": true_mean,
        "last": buf,
        "bytes": opt.last_step_bytes_sent,
    }


def _train(rank: int, world: int, use_onebit: bool, freeze_step: int, steps: int) -> dict:
    torch.manual_seed(0)  # same init and data everywhere; each rank takes its own shard
    teacher = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x = torch.randn(2048, 16)
    with torch.no_grad():
        y = teacher(x) + 0.1 * torch.randn(2048, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    if use_onebit:
        opt = build_optimizer(
            model.parameters(),
            "OneBitAdam",
            {"lr": 3e-3, "freeze_step": freeze_step, "comm_backend_name": "gloo"},
        )
    else:
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    shard = slice(rank * 2048 // world, (rank + 1) * 2048 // world)
    bytes_after_freeze = []
    for _ in range(steps):
        compressing = use_onebit and opt.frozen
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
        if not use_onebit or opt.needs_gradient_allreduce:  # the engine's side of the contract
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        if compressing:
            bytes_after_freeze.append(opt.last_step_bytes_sent)
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(x), y).item()
    out = {"loss": loss, "params": [p.detach().clone() for p in model.parameters()]}
    if use_onebit:
        out.update(bytes=bytes_after_freeze, fp32_bytes=opt.fp32_allreduce_bytes(), frozen=opt.frozen)
        out["reload"] = _reload_resets_errors(opt)
    return out


def _reload_resets_errors(opt: OneBitAdam) -> dict:
    mask = torch.ones(1)
    opt.param_groups[0]["exp_avg_mask"] = mask
    state = opt.state_dict()
    state["param_groups"][0]["exp_avg_mask"] = torch.zeros(1)  # the checkpoint's mask must be dropped
    had_errors = bool(opt._errors)
    opt.load_state_dict(state)
    return {
        "had_errors": had_errors,
        "errors_after": len(opt._errors),
        "frozen": opt.frozen,
        "mask_kept": opt.param_groups[0]["exp_avg_mask"] is mask,
    }


def _numpy(obj):
    """Tensors as numpy arrays: torch would pass them through shared memory that dies with the worker."""
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: _numpy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_numpy(v) for v in obj]
    return obj


def _onebit_world(rank: int, world: int, steps: int, against_adam: bool) -> dict:
    compressed = _compressed_mean(rank, world)
    onebit = _train(rank, world, True, freeze_step=40, steps=steps)
    adam = _train(rank, world, False, freeze_step=0, steps=steps) if against_adam else None
    return _numpy({"compressed": compressed, "onebit": onebit, "adam": adam})


@pytest.mark.parametrize("world", [2, 4])
def test_onebit_adam_on_real_processes(world):
    # at 4 ranks the communication checks, over fewer steps; the loss against Adam's at 2 (CI time)
    steps = 200 if world == 2 else 80
    results = spawn(_onebit_world, world, steps, world == 2)

    # The compressed all-reduce gives every rank the same tensor, and error feedback makes its average exact.
    lasts = [r["compressed"]["last"] for r in results]
    assert all((a == b).all() for r in lasts[1:] for a, b in zip(lasts[0], r))
    for avg, mean in zip(results[0]["compressed"]["avg"], results[0]["compressed"]["mean"]):
        assert abs(avg - mean).max() <= 0.1 * abs(mean).max()  # one 1-bit round alone is off by ~100%

    # After freeze_step the bytes sent are at most 1/20 of an fp32 all-reduce of the same momentum.
    onebit = [r["onebit"] for r in results]
    for r in onebit:
        assert r["frozen"] and len(r["bytes"]) == steps - 40
        assert 0 < max(r["bytes"]) <= r["fp32_bytes"] / 20
    # Replicas stay identical, and the loss ends within 5% of plain Adam's.
    assert all((a == b).all() for r in onebit[1:] for a, b in zip(onebit[0]["params"], r["params"]))
    if results[0]["adam"] is not None:
        adam_loss = results[0]["adam"]["loss"]
        assert onebit[0]["loss"] <= adam_loss * 1.05, (onebit[0]["loss"], adam_loss)

    # Loading a checkpoint resets the error buffers, recomputes the stage, keeps the current mask.
    assert onebit[0]["reload"] == {"had_errors": True, "errors_after": 0, "frozen": True, "mask_kept": True}


@pytest.mark.mpi
def test_onebit_compressed_allreduce_through_mpirun():
    import json
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("mpi4py")
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not installed")
    script = Path(__file__).with_name("_mpi_onebit_script.py")
    cmd = [mpirun, "-np", "2", "--oversubscribe", sys.executable, str(script)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["same"] and result["err"] <= 0.1 and result["bytes"] > 0
