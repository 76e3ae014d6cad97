"""ds_engine on one CUDA device, in one short run: every ZeRO stage and precision trains, fp32 follows plain
PyTorch, and CPU offload takes state off the GPU, measured with torch.cuda's allocator statistics; FSDP2
(``fully_shard``) runs beside it, measured the same way.

    python tools/gpu/gpu_engine_check.py --json out.json             # on a GPU machine (one rank, nccl)
    .venv/bin/python tools/gpu/gpu_engine_check.py --device cpu --model tiny --steps 3   # the tool itself, on CPU

Each case builds the same GPT (tools/bench/_bench_cases.py) on the host and hands it to ``ds_engine.initialize``,
which places it on the device as DeepSpeed's does, then takes ``--warmup`` + ``--steps`` steps on fixed
batches. Before each step a plain forward+backward of an identical fp32 copy on the device is timed (the
ceiling, as in tools/bench/bench_training.py). Per case it prints losses, the median step and ceiling, bytes
allocated on the device after the last step (``memory_allocated``) and the peak during it
(``max_memory_allocated``, reset before it), both above what was allocated before the case (after a
``gc.collect()``: an engine lives in reference cycles, so a deleted one holds its memory until then), and where the parameters' data and the optimizer state live.
The reference is plain PyTorch on the device: AdamW and clipping at 1.0, fp32, the same batches.

The FSDP2 rows shard each block and the root (tools/bench/_bench_cases.py) over the same world of one (nccl on
CUDA, gloo on CPU) and step torch's AdamW with the same clipping. In bf16 they follow ds's bf16 as far as
FSDP2 allows: the forward and backward compute in bf16 and gradients are reduced in bf16
(``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)``), and AdamW updates fp32 weights. Where they
differ: FSDP2 keeps only the fp32 sharded weights between steps and casts them to bf16 at each all-gather,
and its sharded gradients are fp32 (the reduced bf16 gradient cast up); ds keeps bf16 weights (stage 2: the
whole model; stage 3: a bf16 partition) beside an fp32 master partition, and bf16 gradients.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.profiler import record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # _bench_cases, the benchmarks' models
from _bench_cases import BUILDERS, CLIP, LR, MODELS, ModelDims, batch, make_model  # noqa: E402

MODELS = {**MODELS, "gpu": ModelDims(vocab=32_000, width=1024, layers=8, heads=16, seq=512, micro_batch=8)}

# name -> config keys beyond the common ones (the optimizer is named in the config: offload builds its own)
CASES: dict[str, dict] = {
    "stage 0 fp32": {"zero_optimization": {"stage": 0}},
    "stage 1 fp32": {"zero_optimization": {"stage": 1}},
    "stage 2 fp32": {"zero_optimization": {"stage": 2}},
    "stage 3 fp32": {"zero_optimization": {"stage": 3}},
    "stage 2 fp32 offload_optimizer": {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    },
    "stage 3 fp32 offload_optimizer+param": {
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "cpu"},
        }
    },
    "stage 2 bf16": {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}},
    "stage 3 bf16": {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}},
    "stage 1 fp16": {"zero_optimization": {"stage": 1}, "fp16": {"enabled": True, "initial_scale_power": 12}},
    "stage 3 fp16": {"zero_optimization": {"stage": 3}, "fp16": {"enabled": True, "initial_scale_power": 12}},
    "FSDP2 fp32": {"fsdp2": "fp32"},  # torch's fully_shard, not ds: see the module's docstring
    "FSDP2 bf16": {"fsdp2": "bf16"},
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _peak(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def _batches(d: ModelDims, n: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [tuple(t.to(device) for t in batch(d, 0, i)) for i in range(n)]  # type: ignore[misc]


def reference(d: ModelDims, n: int, device: torch.device) -> list[float]:
    """Plain PyTorch: the fp32 model on the device, AdamW, clipping at CLIP."""
    model = make_model(d).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for idx, tgt in _batches(d, n, device):
        loss = model(idx, tgt)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def _ds(model: nn.Module, extra: dict, d: ModelDims, device: torch.device):
    """ds_engine on the case's config: (forward+backward returning the loss, step, facts after the run)."""
    import ds_engine

    config = {
        "train_micro_batch_size_per_gpu": d.micro_batch,
        "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
        "steps_per_print": 10**9,
        **copy.deepcopy(extra),
    }
    engine, *_ = ds_engine.initialize(model=model, config=config)

    def fwd_bwd(idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        with record_function("phase/forward"):  # for tools/gpu/profile_zero_gpu.py; nearly free unprofiled
            loss = engine(idx, tgt)
        with record_function("phase/backward"):
            engine.backward(loss)
        return loss

    def facts() -> dict:
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)  # the optimizer the step updates
        masters = [p for g in inner.param_groups for p in g["params"]]
        state = [
            v for s in getattr(inner, "state", {}).values() for v in s.values() if isinstance(v, torch.Tensor)
        ]
        return {
            "model_params_on": sorted({str(p.device) for p in engine.module.parameters()}),
            "optimizer_params_on": sorted({str(p.device) for p in masters}),
            "optimizer_state_on": sorted({str(v.device) for v in state if v.numel() > 1}),
            "optimizer": type(inner).__name__,
            "loss_scale": _loss_scale(engine),
            "skipped_steps": int(getattr(engine, "skipped_steps", 0)),
        }

    return fwd_bwd, engine.step, facts


def _fsdp2(model: nn.Module, extra: dict, d: ModelDims, device: torch.device):
    """FSDP2 as tools/bench/bench_training.py builds it, on ``device``'s mesh, with torch's AdamW."""
    spec = {"impl": "fsdp2", "dtype": extra["fsdp2"], "device": device.type}
    fwd_bwd, update = BUILDERS["fsdp2"](model, spec, d)

    def facts() -> dict:
        on = sorted({str(p.device) for p in model.parameters()})
        return {"model_params_on": on, "optimizer_params_on": on, "optimizer_state_on": on}

    return fwd_bwd, update, facts


def run_case(name: str, extra: dict, d: ModelDims, args: argparse.Namespace, device: torch.device) -> dict:
    gc.collect()  # the previous case's engine sits in reference cycles (hooks): free its memory first
    if device.type == "cuda":
        torch.cuda.empty_cache()
    before = _allocated(device)
    model = make_model(d)  # on the host: the engine (or fully_shard) places it
    ceiling = copy.deepcopy(model).to(device)
    fwd_bwd, update, facts = (_fsdp2 if "fsdp2" in extra else _ds)(model, extra, d, device)
    n = args.warmup + args.steps
    losses, step_s, ceiling_s = [], [], []
    for i, (idx, tgt) in enumerate(_batches(d, n + 1, device)):
        if i == n:  # one more step, for memory
            del ceiling
            loss = None  # the last step's graph is not part of the measured state
            gc.collect()
            _sync(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            fwd_bwd(idx, tgt)
            update()
            _sync(device)
            break
        _sync(device)
        t0 = time.perf_counter()
        ceiling(idx, tgt).backward()
        _sync(device)
        t1 = time.perf_counter()
        ceiling.zero_grad(set_to_none=True)
        loss = fwd_bwd(idx, tgt)
        update()
        _sync(device)
        t2 = time.perf_counter()
        losses.append(float(loss.detach()))
        if i >= args.warmup:
            ceiling_s.append(t1 - t0)
            step_s.append(t2 - t1)
    out = {
        "case": name,
        "losses": losses,
        "step_ms": statistics.median(step_s) * 1e3,
        "ceiling_ms": statistics.median(ceiling_s) * 1e3,
        "allocated_after_step_mib": (_allocated(device) - before) / 2**20,
        "peak_during_step_mib": (_peak(device) - before) / 2**20,
        "optimizer": "torch AdamW",
        "loss_scale": None,
        "skipped_steps": 0,
        **facts(),
    }
    del fwd_bwd, update, facts, model
    return out


def _loss_scale(engine) -> float | None:
    scale = getattr(engine.optimizer, "cur_scale", None) or getattr(engine.optimizer, "loss_scale", None)
    try:
        return float(scale) if scale is not None else None
    except (TypeError, ValueError):
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="gpu", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=10, help="timed steps per case")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--json", default="gpu_engine_check.json")
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", args.device)
    device = torch.device(args.device)
    import ds_launch

    ds_launch.init_distributed()  # the world of one that ds_engine.initialize would make; FSDP2 shares it
    d = MODELS[args.model]
    numel = sum(p.numel() for p in make_model(d).parameters())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"model {args.model}: {numel / 1e6:.1f}M parameters, micro batch {d.micro_batch} x {d.seq}; {name}")
    ref = reference(d, args.warmup + args.steps, device)
    print(f"reference (PyTorch AdamW fp32) losses: {[round(x, 4) for x in ref]}")
    rows, failed = [], 0
    for case in args.cases.split(","):
        try:
            r = run_case(case, CASES[case], d, args, device)
        except Exception as exc:  # a failing case is a row, and the run goes on
            import traceback

            traceback.print_exc()
            rows.append({"case": case, "error": f"{type(exc).__name__}: {exc}"})
            failed += 1
            print(f"| {case} | failed: {type(exc).__name__}: {exc} |", flush=True)
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        rel = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref))
        r["max_rel_loss_diff_vs_reference"] = rel
        rows.append(r)
        print(
            f"| {case} | step {r['step_ms']:.1f} ms | ceiling {r['ceiling_ms']:.1f} ms | "
            f"after step {r['allocated_after_step_mib']:.0f} MiB | peak {r['peak_during_step_mib']:.0f} MiB | "
            f"model on {r['model_params_on']} | {r['optimizer']} params on {r['optimizer_params_on']} | "
            f"state on {r['optimizer_state_on']} | "
            f"max rel loss diff {rel:.2e} | scale {r['loss_scale']} | skipped {r['skipped_steps']} | "
            f"losses {[round(x, 4) for x in r['losses']]} |",
            flush=True,
        )
    Path(args.json).write_text(
        json.dumps({"model": args.model, "numel": numel, "reference": ref, "rows": rows})
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
