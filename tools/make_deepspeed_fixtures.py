"""Write small checkpoints with the real ``deepspeed`` package, for ds-checkpoint's import tests.

Run from the repository root (any Python; the training itself runs in the DeepSpeed venv):

    python tools/make_deepspeed_fixtures.py [--deepspeed-python /work/venvs/deepspeed/bin/python]

For each case (ZeRO 0 fp32, ZeRO 1 fp32, ZeRO 2 fp32, ZeRO 1 bf16, ZeRO 2 bf16, ZeRO 3 fp32, ZeRO 3 bf16)
it trains a tiny model for 3 steps on 2 CPU processes (gloo) and writes
``packages/ds-checkpoint/tests/fixtures/<case>/ckpt/`` (DeepSpeed's own layout, ``latest`` included) and
``<case>/expected.safetensors``: DeepSpeed's live state after the last step (gathered from the
optimizer's partitions in memory, not from the files), per parameter name: ``fp32.<name>``,
``exp_avg.<name>``, ``exp_avg_sq.<name>`` and ``module.<name>`` (the module's state dict), plus
``expected.json`` (counters, client_state, scheduler state, loss-scaler state).

ZeRO 3 cases use a model with a tied weight (``5.weight`` is ``3.weight``) and odd-sized parameters, so
DeepSpeed's per-parameter partition padding matters. Their ``expected.safetensors`` also holds
``zero_to_fp32.<name>``: DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint`` of the saved files,
and ``expected.json`` the ``config`` used and ``resume_losses``: the mean loss over both ranks of
RESUME_STEPS more steps DeepSpeed took after saving (module in eval mode), rank r feeding rows [4r, 4r+4) of
``torch.randn(8, 4, generator=torch.Generator().manual_seed(RESUME_SEED + step))``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "packages/ds-checkpoint/tests/fixtures"
WORLD_SIZE = 2
STEPS = 3
RESUME_STEPS = 3
RESUME_SEED = 7
CASES = {  # name -> (zero stage, dtype)
    "zero0_fp32": (0, "fp32"),
    "zero1_fp32": (1, "fp32"),
    "zero2_fp32": (2, "fp32"),
    "zero1_bf16": (1, "bf16"),
    "zero2_bf16": (2, "bf16"),
    "zero3_fp32": (3, "fp32"),
    "zero3_bf16": (3, "bf16"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build_model(dtype: str, stage: int = 0):
    import torch

    torch.manual_seed(0)
    # 29 trainable elements: not a multiple of 2*dp, so the last rank's partition carries padding.
    # BatchNorm (buffers) in fp32; CPU batch_norm rejects bf16 weights, so LayerNorm (same names) in bf16.
    norm = torch.nn.LayerNorm(3) if dtype == "bf16" else torch.nn.BatchNorm1d(3)
    if stage < 3:
        return torch.nn.Sequential(torch.nn.Linear(4, 3), norm, torch.nn.ReLU(), torch.nn.Linear(3, 2))
    # stage 3 pads every parameter to a multiple of dp: 3-element biases and 9-element weights are odd;
    # 5.weight is 3.weight (tied), so the checkpoint stores it once
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 3), norm, torch.nn.ReLU(), torch.nn.Linear(3, 3), torch.nn.Tanh(),
        torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2),
    )  # fmt: skip
    model[5].weight = model[3].weight
    return model


def _full_optimizer_state(engine, stage: int) -> dict:
    """Per parameter name: fp32 master, exp_avg, exp_avg_sq, gathered from DeepSpeed's live state."""
    import torch

    opt = engine.optimizer
    out = {}
    if stage == 3:  # DeepSpeed's own gather of a partitioned parameter's full state (collective)
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        for name, param in engine.module.named_parameters():
            out[f"fp32.{name}"] = safe_get_full_fp32_param(param).detach().float().clone()
            for key in ("exp_avg", "exp_avg_sq"):
                out[f"{key}.{name}"] = safe_get_full_optimizer_state(param, key).detach().float().clone()
        return out
    if stage == 0:  # no ZeRO: the plain torch optimizer owns whole per-parameter state
        for name, param in engine.module.named_parameters():
            out[f"fp32.{name}"] = param.detach().float().clone()
            for key in ("exp_avg", "exp_avg_sq"):
                out[f"{key}.{name}"] = opt.state[param][key].detach().clone()
        return out
    if hasattr(opt, "single_partition_of_fp32_groups"):  # ZeRO 1/2 optimizer
        parts = opt.single_partition_of_fp32_groups
        groups = getattr(opt, "round_robin_bit16_groups", None) or opt.bit16_groups
    else:  # BF16_Optimizer (ZeRO 1 + bf16)
        parts, groups = opt.fp32_groups_flat_partition, opt.bf16_groups
    world_size = torch.distributed.get_world_size()
    for part, params in zip(parts, groups):
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            local = part.detach() if key == "fp32" else opt.optimizer.state[part][key].detach()
            gathered = [torch.empty_like(local) for _ in range(world_size)]
            torch.distributed.all_gather(gathered, local.contiguous())
            flat = torch.cat(gathered)  # the padded flat space; padding sits at the end
            offset = 0
            for param in params:
                n = param.numel()
                out[f"{key}.{engine.param_names[param]}"] = (
                    flat[offset : offset + n].view(param.shape).clone()
                )
                offset += n
    return out


def _worker(stage: int, dtype: str, out: Path) -> None:
    """One rank: train STEPS steps with deepspeed, save, dump what deepspeed reports."""
    import deepspeed
    import torch
    from safetensors.torch import save_file

    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    model = _build_model(dtype, stage)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() == 2)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-2
    )
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 1e-2}},
        "steps_per_print": 1000,
        "gradient_clipping": 1.0,  # DeepSpeed 0.19's default, explicit so a resuming ds engine uses it too
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x = torch.randn(4, 4, generator=gen).to(engine.module[0].weight.dtype)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    if stage == 3:
        # each rank's BatchNorm statistics differ, and stage 3 saves every rank's (one model file each),
        # where a ds import keeps one set: average them first so a resume at any world size can match
        for buffer in engine.module.buffers():
            if buffer.is_floating_point():
                torch.distributed.all_reduce(buffer)
                buffer /= torch.distributed.get_world_size()
    client_state = {"epoch": 2, "note": "fixture", "best_loss": 0.25}
    engine.save_checkpoint(str(out / "ckpt"), tag="global_step3", client_state=client_state)

    expected = _full_optimizer_state(engine, stage)
    if stage == 3:  # the module's partitioned parameters are placeholders: gather them to read
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            module_state = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    else:
        module_state = engine.module.state_dict()
    for name, tensor in module_state.items():
        expected[f"module.{name}"] = tensor.detach().clone()
    # counters and scheduler state as saved, before the continuation moves them on
    facts = {
        "zero_stage": stage,
        "dtype": dtype,
        "world_size": torch.distributed.get_world_size(),
        "global_steps": engine.global_steps,
        "global_samples": engine.global_samples,
        "skipped_steps": engine.skipped_steps,
        "client_state": client_state,
        "lr_scheduler": engine.lr_scheduler.state_dict(),
        "deepspeed_version": deepspeed.__version__,
    }
    resume_losses = _continue(engine, rank) if stage == 3 else None
    torch.distributed.barrier()
    if rank == 0 and stage == 3:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        consolidated = get_fp32_state_dict_from_zero_checkpoint(str(out / "ckpt"), tag="global_step3")
        for name, tensor in consolidated.items():
            expected[f"zero_to_fp32.{name}"] = tensor.detach().float().clone()
    if rank == 0:
        save_file(expected, str(out / "expected.safetensors"))
        facts["config"] = config
        if resume_losses is not None:
            facts["resume_losses"] = resume_losses
        (out / "expected.json").write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")


def _continue(engine, rank: int) -> list[float]:
    """RESUME_STEPS more steps after the save; the mean loss over the ranks of each.

    In eval mode: BatchNorm then normalizes with the saved running statistics, not per-rank batch
    statistics, so a resumed run at another world size computes the same losses.
    """
    import torch

    engine.module.eval()
    losses = []
    for step in range(RESUME_STEPS):
        batch = torch.randn(4 * WORLD_SIZE, 4, generator=torch.Generator().manual_seed(RESUME_SEED + step))
        x = batch[4 * rank : 4 * rank + 4].to(next(engine.module.parameters()).dtype)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / WORLD_SIZE)
    return losses


def _run_case(python: str, name: str, stage: int, dtype: str) -> None:
    out = FIXTURES / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    port = _free_port()
    procs = []
    for rank in range(WORLD_SIZE):
        env = dict(
            os.environ,
            DS_ACCELERATOR="cpu",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(WORLD_SIZE),
            LOCAL_WORLD_SIZE=str(WORLD_SIZE),
            OMP_NUM_THREADS="1",
        )
        cmd = [python, __file__, "--worker", str(stage), dtype, str(out)]
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait(timeout=900) for p in procs]
    if any(codes):
        raise SystemExit(f"case {name}: worker exit codes {codes}")
    # zero_to_fp32.py / zero_to_torch.py are DeepSpeed recovery scripts (~40 KB); tests do not need them.
    for script in (out / "ckpt").glob("zero_to_*.py"):
        script.unlink()
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed-python", default="/work/venvs/deepspeed/bin/python")
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), help="cases to (re)generate")
    parser.add_argument("--worker", nargs=3, metavar=("STAGE", "DTYPE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        stage, dtype, out = args.worker
        _worker(int(stage), dtype, Path(out))
        return
    for name in args.only or CASES:
        stage, dtype = CASES[name]
        _run_case(args.deepspeed_python, name, stage, dtype)


if __name__ == "__main__":
    sys.exit(main())
