"""What DeepSpeed 0.19.8's config objects, LR schedules and engine do, recorded for the ``deepspeed`` package.

Used by ``tools/make_deepspeed_behaviour_fixtures.py`` (run it with the real DeepSpeed, see its docstring):
``config_objects`` reads ``DeepSpeedConfig`` and its section models for a list of configs (attribute
values, aliases, deprecated keys, hjson files, the errors for bad values); ``lr_schedules`` steps each
schedule with a tensor ``lr`` and with per-group lists; ``engine_behaviours`` builds engines without an
optimizer, uses ``no_sync`` at each ZeRO stage, and a ZeRO-3 model whose forward returns another module's
parameter; ``no_sync_ranks`` is the 2-rank part of ``no_sync`` (started as two processes by the tool).
Every value is JSON-safe: an error is ``{"mro": [...], "message": "..."}``.
"""

from __future__ import annotations

import json
import math
from typing import Any

# configs whose DeepSpeedConfig is read attribute by attribute
CONFIGS: dict[str, dict] = {
    "minimal": {"train_batch_size": 4},
    "stage2": {"train_batch_size": 4, "zero_optimization": {"stage": 2}},
    "stage3": {"train_batch_size": 4, "zero_optimization": {"stage": 3}},
    "stage3.aliases": {
        "train_batch_size": 4,
        "zero_optimization": {
            "stage": 3,
            "stage3_prefetch_bucket_size": 1234,
            "stage3_param_persistence_threshold": 99,
            "stage3_max_live_parameters": 777,
            "stage3_max_reuse_distance": 555,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    },
    "stage3.field_names": {
        "train_batch_size": 4,
        "zero_optimization": {
            "stage": 3,
            "prefetch_bucket_size": 4321,
            "gather_16bit_weights_on_model_save": True,
        },
    },
    "stage3.overlap_false": {"train_batch_size": 4, "zero_optimization": {"stage": 3, "overlap_comm": False}},
    "deprecated.cpu_offload": {"train_batch_size": 4, "zero_optimization": {"stage": 2, "cpu_offload": True}},
    "deprecated.gather_fp16": {
        "train_batch_size": 4,
        "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": True},
    },
    "deprecated.cpu_offload_param": {
        "train_batch_size": 4,
        "zero_optimization": {"stage": 3, "cpu_offload_param": True},
    },
    "deprecated.bfloat16": {"train_batch_size": 4, "bfloat16": {"enabled": True}},
    "offload": {
        "train_batch_size": 4,
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu"},
        },
    },
    "fp16": {"train_batch_size": 4, "fp16": {"enabled": True, "loss_scale": 128, "initial_scale_power": 8}},
    "allreduce_op.sum": {"train_batch_size": 4, "gradient_allreduce_op": "sum"},
    "allreduce_op.mean": {"train_batch_size": 4, "gradient_allreduce_op": "mean"},
    "pipeline": {"train_batch_size": 4, "pipeline": {"stages": "auto", "partition": "uniform"}},
    "full": {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1, "reduce_bucket_size": 1000},
        "steps_per_print": 7,
    },
}

# configs DeepSpeedConfig refuses: the error class and message
BAD_CONFIGS: dict[str, dict] = {
    "loss_scale.bool": {"train_batch_size": 4, "fp16": {"enabled": True, "loss_scale": True}},
    "loss_scale.str": {"train_batch_size": 4, "fp16": {"enabled": True, "loss_scale": "x"}},
    "loss_scale.inf": {"train_batch_size": 4, "fp16": {"enabled": True, "loss_scale": math.inf}},
    "loss_scale.nan": {"train_batch_size": 4, "fp16": {"enabled": True, "loss_scale": math.nan}},
    "loss_scale.negative": {"train_batch_size": 4, "fp16": {"enabled": True, "loss_scale": -1}},
    "loss_scale_window.zero": {"train_batch_size": 4, "fp16": {"enabled": True, "loss_scale_window": 0}},
    "min_loss_scale.zero": {"train_batch_size": 4, "fp16": {"enabled": True, "min_loss_scale": 0}},
    "allreduce_op.bad": {"train_batch_size": 4, "gradient_allreduce_op": "max"},
    "allreduce_op.sum_stage3": {
        "train_batch_size": 4,
        "gradient_allreduce_op": "sum",
        "zero_optimization": {"stage": 3},
    },
    "gather_fp16_and_16bit": {
        "train_batch_size": 4,
        "zero_optimization": {
            "stage": 3,
            "stage3_gather_fp16_weights_on_model_save": True,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    },
    "fp16_and_bf16": {"train_batch_size": 4, "fp16": {"enabled": True}, "bf16": {"enabled": True}},
}

# DeepSpeedConfig attributes read for every config (those frameworks and user code read)
TOP_ATTRIBUTES = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "steps_per_print",
    "gradient_clipping",
    "gradient_allreduce_op",
    "prescale_gradients",
    "gradient_predivide_factor",
    "zero_enabled",
    "zero_optimization_stage",
    "optimizer_name",
    "optimizer_params",
    "scheduler_name",
    "scheduler_params",
    "pipeline",
    "world_size",
    "global_rank",
    "fp16_enabled",
    "bfloat16_enabled",
    "loss_scale",
    "initial_dynamic_scale",
    "dynamic_loss_scale_args",
    "wall_clock_breakdown",
    "memory_breakdown",
    "dump_state",
    "dataloader_drop_last",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "checkpoint_tag_validation_enabled",
    "checkpoint_tag_validation_fail",
    "load_universal_checkpoint",
    "use_node_local_storage",
    "grad_accum_dtype",
    "communication_data_type",
    "disable_allgather",
    "sparse_gradients_enabled",
    "amp_enabled",
    "elasticity_enabled",
)
# zero_config attributes read by their DeepSpeed field names
ZERO_ATTRIBUTES = (
    "stage",
    "overlap_comm",
    "contiguous_gradients",
    "reduce_scatter",
    "reduce_bucket_size",
    "allgather_partitions",
    "allgather_bucket_size",
    "load_from_fp32_weights",
    "elastic_checkpoint",
    "round_robin_gradients",
    "prefetch_bucket_size",
    "param_persistence_threshold",
    "max_live_parameters",
    "max_reuse_distance",
    "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save",
    "sub_group_size",
    "ignore_unused_parameters",
    "pipeline_loading_checkpoint",
    "cpu_offload",
    "cpu_offload_param",
    "cpu_offload_use_pin_memory",
    "model_persistence_threshold",
)
FP16_ATTRIBUTES = (
    "enabled",
    "loss_scale",
    "initial_scale_power",
    "loss_scale_window",
    "hysteresis",
    "consecutive_hysteresis",
    "min_loss_scale",
    "auto_cast",
    "fp16_master_weights_and_grads",
)
BF16_ATTRIBUTES = ("enabled", "immediate_grad_update", "check_grad_overflow")
OFFLOAD_ATTRIBUTES = ("device", "pin_memory", "ratio", "buffer_count", "fast_init")


def error(fn) -> dict | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the class is what is recorded
        return {"mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    return None


def jsonable(value: Any) -> Any:
    """``value`` as JSON: enums by value, models by their dump, anything else by repr."""
    if (
        hasattr(value, "value")
        and type(value).__module__ != "builtins"
        and not isinstance(value, (int, float))
    ):
        value = value.value
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and type(value) not in (int, float):
        value = int(value) if isinstance(value, int) else float(value)  # IntEnum members, numpy scalars
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return {"repr": repr(value)}


def _read(obj: Any, names: tuple[str, ...]) -> dict:
    out = {}
    for name in names:
        try:
            out[name] = jsonable(getattr(obj, name))
        except Exception as exc:  # noqa: BLE001 - recorded: this name is missing there
            out[name] = {"missing": type(exc).__name__}
    return out


def _section_reads(cfg: Any) -> dict:
    zero = cfg.zero_config
    got = {
        "top": _read(cfg, TOP_ATTRIBUTES),
        "zero": _read(zero, ZERO_ATTRIBUTES),
        "fp16": _read(cfg.float16_config, FP16_ATTRIBUTES),
        "bf16": _read(cfg.bfloat16_config, BF16_ATTRIBUTES),
        "zero_type": type(zero).__name__,
        "fp16_type": type(cfg.float16_config).__name__,
    }
    for name in ("offload_optimizer", "offload_param"):
        section = getattr(zero, name)
        got[name] = None if section is None else _read(section, OFFLOAD_ATTRIBUTES)
    return got


def config_objects(deepspeed: Any, tmp_dir: str) -> dict:
    """DeepSpeedConfig and the section models, read as code does; errors for bad configs."""
    from deepspeed.runtime import config as ds_config_mod
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig

    got: dict = {"configs": {}, "errors": {}}
    for name, config in CONFIGS.items():
        try:
            got["configs"][name] = _section_reads(
                ds_config_mod.DeepSpeedConfig(json.loads(json.dumps(config)))
            )
        except Exception as exc:  # noqa: BLE001 - recorded: refused
            got["configs"][name] = {
                "refused": {"mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
            }
    for name, config in BAD_CONFIGS.items():
        got["errors"][name] = error(lambda c=config: ds_config_mod.DeepSpeedConfig(c))
    # an hjson file: comments, unquoted keys, trailing commas
    path = f"{tmp_dir}/ds_config.hjson"
    with open(path, "w") as f:
        f.write(
            "{\n  # hjson comment\n  train_batch_size: 8\n  zero_optimization: {stage: 2,}\n  gradient_clipping: 0.25\n}\n"
        )
    cfg = ds_config_mod.DeepSpeedConfig(path)
    got["hjson"] = {
        "train_batch_size": cfg.train_batch_size,
        "stage": int(cfg.zero_optimization_stage),
        "gradient_clipping": cfg.gradient_clipping,
    }
    # the section models built directly, by field name and by alias
    z = DeepSpeedZeroConfig(stage=3, stage3_prefetch_bucket_size=11, stage3_max_live_parameters=12)
    z2 = DeepSpeedZeroConfig(stage=3, prefetch_bucket_size=21)
    got["zero_direct"] = {
        "alias": _read(z, ZERO_ATTRIBUTES),
        "field_name": _read(z2, ("prefetch_bucket_size", "overlap_comm")),
        "dump_by_alias_keys": sorted(z.model_dump(by_alias=True)),
        "dump_keys": sorted(z.model_dump()),
        "stage_type": type(z.stage).__name__,
        "default_stage0_overlap": DeepSpeedZeroConfig().overlap_comm,
        "bad_stage": error(lambda: DeepSpeedZeroConfig(stage=7)),
        "unknown_key": error(lambda: DeepSpeedZeroConfig(stage=1, no_such_key=1)),
    }
    off = DeepSpeedZeroOffloadOptimizerConfig(device="cpu", ratio=0.5)
    got["offload_direct"] = _read(off, OFFLOAD_ATTRIBUTES)
    # the module-level get_* functions over a raw param dict
    params = CONFIGS["full"]
    getters = {}
    for fn_name in (
        "get_gradient_clipping",
        "get_train_batch_size",
        "get_train_micro_batch_size_per_gpu",
        "get_gradient_accumulation_steps",
        "get_steps_per_print",
        "get_optimizer_name",
        "get_optimizer_params",
        "get_scheduler_name",
        "get_scheduler_params",
        "get_prescale_gradients",
        "get_gradient_predivide_factor",
        "get_gradient_allreduce_op",
        "get_zero_allow_untested_optimizer",
        "get_dump_state",
        "get_wall_clock_breakdown",
        "get_dataloader_drop_last",
        "get_pipeline_config",
        "get_optimizer_gradient_clipping",
        "get_disable_allgather",
        "get_memory_breakdown",
    ):
        fn = getattr(ds_config_mod, fn_name)
        getters[fn_name] = {"full": jsonable(fn(dict(params))), "empty": jsonable(fn({}))}
    got["getters"] = getters
    return got


def lr_schedules(torch: Any) -> dict:
    """Each schedule with a tensor lr, with per-group lists, and its public methods."""
    from deepspeed.runtime import lr_schedules as ls

    def opt(lr, groups=1):
        ps = [torch.nn.Parameter(torch.ones(2)) for _ in range(groups)]
        return torch.optim.SGD([{"params": [p]} for p in ps], lr=lr)

    def tensor_opt():
        return opt(torch.tensor(0.01))

    builders = {
        "WarmupLR": lambda o, per: ls.WarmupLR(
            o, warmup_min_lr=per([0.0, 0.001]), warmup_max_lr=per([0.01, 0.02]), warmup_num_steps=4
        ),
        "WarmupDecayLR": lambda o, per: ls.WarmupDecayLR(
            o,
            total_num_steps=8,
            warmup_min_lr=per([0.0, 0.001]),
            warmup_max_lr=per([0.01, 0.02]),
            warmup_num_steps=4,
        ),
        "WarmupCosineLR": lambda o, per: ls.WarmupCosineLR(o, total_num_steps=8, warmup_num_steps=4),
        "OneCycle": lambda o, per: ls.OneCycle(
            o, cycle_min_lr=per([0.001, 0.002]), cycle_max_lr=per([0.01, 0.02]), cycle_first_step_size=3
        ),
        "LRRangeTest": lambda o, per: ls.LRRangeTest(o, lr_range_test_min_lr=per([0.001, 0.002])),
    }
    got: dict = {}
    for name, build in builders.items():
        cls = getattr(ls, name)
        entry: dict = {
            "methods": sorted(n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n)))
        }

        def trace(sched, o):
            rows = []
            for _ in range(5):
                sched.step()
                lr = o.param_groups[0]["lr"]
                last = sched.get_last_lr()
                row = {
                    "group_lr_is_tensor": torch.is_tensor(lr),
                    "group_lrs": [float(g["lr"]) for g in o.param_groups],
                    "last_lr_types": [type(v).__name__ for v in last],
                    "last_lr": [float(v) for v in last],
                    "get_lr": [float(v) for v in sched.get_lr()],
                }
                if hasattr(sched, "get_lr_ratio"):
                    row["lr_ratio"] = float(sched.get_lr_ratio())
                rows.append(row)
            return rows

        o = tensor_opt()
        try:
            sched = build(o, lambda v: v[0])
            entry["tensor_lr"] = {
                "at_init_is_tensor": torch.is_tensor(o.param_groups[0]["lr"]),
                "steps": trace(sched, o),
            }
        except Exception as exc:  # noqa: BLE001
            entry["tensor_lr"] = {"error": f"{type(exc).__name__}: {exc}"}
        o = opt(0.05, groups=2)
        try:
            entry["per_group"] = trace(build(o, lambda v: v), o)
        except Exception as exc:  # noqa: BLE001
            entry["per_group"] = {"error": f"{type(exc).__name__}: {exc}"}
        o = opt(0.05, groups=2)
        entry["wrong_list_length"] = error(lambda o=o, build=build: build(o, lambda v: [v[0]] * 3))
        got[name] = entry
    return got


def _net(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def no_optimizer(deepspeed: Any, torch: Any) -> dict:
    """``initialize`` with neither an optimizer nor an optimizer section: what is returned and what works."""
    got: dict = {}
    for stage in (0, 1, 3):
        config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}}
        entry: dict = {}
        try:
            engine, optimizer, _, sched = deepspeed.initialize(model=_net(torch), config=config)
        except Exception as exc:  # noqa: BLE001
            got[f"stage{stage}"] = {
                "initialize": {"mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
            }
            continue
        entry["optimizer"] = None if optimizer is None else type(optimizer).__name__
        entry["engine.optimizer"] = None if engine.optimizer is None else type(engine.optimizer).__name__
        entry["lr_scheduler"] = None if sched is None else type(sched).__name__
        x = torch.linspace(-1, 1, 8).reshape(2, 4)
        out = engine(x)
        entry["forward"] = out.detach().flatten().tolist()
        returned = engine.eval()
        entry["eval_returns"] = None if returned is None else type(returned).__name__
        with torch.no_grad():
            entry["eval_forward"] = engine(x).flatten().tolist()
        engine.train()
        loss = engine(x).sum()
        entry["backward"] = error(lambda loss=loss, engine=engine: engine.backward(loss))
        grads = [p.grad for p in engine.module.parameters()]
        entry["grads_after_backward"] = [g is not None for g in grads]
        entry["step"] = error(engine.step)
        entry["global_steps"] = engine.global_steps
        entry["get_lr"] = error(engine.get_lr) or {"value": jsonable(engine.get_lr())}
        got[f"stage{stage}"] = entry
    return got


def no_sync_refusals(deepspeed: Any, torch: Any) -> dict:
    got = {}
    for stage in (0, 1, 2, 3):
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "zero_optimization": {"stage": stage},
            "zero_allow_untested_optimizer": True,
        }
        engine = deepspeed.initialize(model=_net(torch), config=config)[0]

        def enter(engine=engine):
            with engine.no_sync():
                pass

        got[f"stage{stage}"] = error(enter)
    return got


def external_parameter(deepspeed: Any, torch: Any) -> dict:
    """ZeRO-3: a submodule returns its own bias to its parent, which returns it on (a parameter of another
    module), and the parent's parent adds it into the loss. Losses, the returned bias's status, weights."""
    nn = torch.nn
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    seen: dict = {"status": []}

    class Dangling(nn.Linear):
        def forward(self, x):
            return super().forward(x), self.bias  # returns its own parameter

    class Middle(nn.Linear):
        def __init__(self):
            super().__init__(6, 6)
            self.inner = Dangling(6, 6)

        def forward(self, x):
            out, bias = self.inner(super().forward(x))
            param = bias if hasattr(bias, "ds_status") else getattr(bias, "ds_param_alias", bias)
            seen["status"].append(str(getattr(param, "ds_status", None)))
            return out, bias  # the inner module's parameter, returned by this one

    class Container(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Linear(6, 6)
            self.middle = Middle()

        def forward(self, x):
            out, bias = self.middle(self.first(x))
            return (out + bias).pow(2).mean()

    got: dict = {}
    for stage in (0, 3):
        torch.manual_seed(0)
        model = Container()
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
            "zero_allow_untested_optimizer": True,
        }
        engine = deepspeed.initialize(model=model, config=config)[0]
        seen["status"] = []
        losses = []
        err = None
        try:
            for step in range(3):
                x = torch.linspace(-1, 1, 12).reshape(2, 6) * (step + 1)
                loss = engine(x)
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
        except Exception as exc:  # noqa: BLE001
            err = {"mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
        entry = {"losses": losses, "error": err, "returned_bias_status": sorted(set(seen["status"]))}
        if stage == 3:
            entry["inner_bias_status_after"] = str(model.middle.inner.bias.ds_status)
            entry["ZeroParamStatus.AVAILABLE"] = str(ZeroParamStatus.AVAILABLE)
        got[f"stage{stage}"] = entry
    return got


def no_sync_ranks(deepspeed: Any, torch: Any, rank: int) -> dict:
    """At 2 ranks: a backward inside no_sync, one outside, then step (each stage, gas 1 and 2; with and
    without a ``step()`` after the backward inside). Weights after, and the gradient inside."""
    got = {}
    for stage in (0, 1):
        for gas in (1, 2):
            for step_between in (True, False):
                torch.manual_seed(0)
                model = torch.nn.Linear(3, 2)
                config = {
                    "train_micro_batch_size_per_gpu": 1,
                    "gradient_accumulation_steps": gas,
                    "optimizer": {"type": "SGD", "params": {"lr": 0.5}},
                    "zero_optimization": {"stage": stage},
                    "zero_allow_untested_optimizer": True,
                }
                engine = deepspeed.initialize(model=model, config=config)[0]
                x = torch.tensor([[1.0, 2.0, 3.0]]) * (rank + 1)
                entry: dict = {}
                try:
                    with engine.no_sync():
                        engine.backward(engine(x).sum())
                        entry["grad_inside"] = [
                            p.grad.flatten().tolist() if p.grad is not None else None
                            for p in model.parameters()
                        ]
                    if step_between:
                        engine.step()  # the micro-step of the backward inside
                    engine.backward(engine(x * -0.5).sum())
                    engine.step()
                    entry["weights"] = [p.detach().flatten().tolist() for p in model.parameters()]
                    entry["global_steps"] = engine.global_steps
                except Exception as exc:  # noqa: BLE001
                    entry["error"] = {"mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
                got[f"stage{stage}.gas{gas}.step_between={step_between}"] = entry
    return got
