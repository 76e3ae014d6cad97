"""Cross-key rules. Each rule looks at a validated :class:`DSConfig` and returns its problems."""

from __future__ import annotations

import difflib
import sys
import warnings
from collections.abc import Callable
from typing import Any

from ._errors import ConfigProblem, ConfigWarning
from ._models import (
    NATIVE_OPTIMIZERS,
    NATIVE_SCHEDULERS,
    BSLongformerSparseAttentionConfig,
    DSConfig,
    FixedSparseAttentionConfig,
    VariableSparseAttentionConfig,
)

__all__ = ["RULES", "check_rules", "TORCH_OPTIMIZERS", "TORCH_LR_SCHEDULERS"]

# torch.optim / torch.optim.lr_scheduler class names (torch 2.x). ds_config never imports torch: when the
# caller has already imported it, its real attributes are consulted as well (see _torch_has).
TORCH_OPTIMIZERS = (
    "ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "LBFGS", "Muon", "NAdam", "RAdam",
    "RMSprop", "Rprop", "SGD", "SparseAdam",
)  # fmt: skip
TORCH_LR_SCHEDULERS = (
    "ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR",
    "ExponentialLR", "LambdaLR", "LinearLR", "MultiStepLR", "MultiplicativeLR", "OneCycleLR", "PolynomialLR",
    "ReduceLROnPlateau", "SequentialLR", "StepLR",
)  # fmt: skip

# ZeRO's "tested" optimizers (docs/design.md §4): others need zero_allow_untested_optimizer.
_ZERO_TESTED = {"adam", "adamw", "Adam", "AdamW", "Adagrad"}

_ADAM_PARAMS = {
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "bias_correction",
    "amsgrad",
    "adam_w_mode",
    "torch_adam",
    "fp32_optimizer_states",  # DeepSpeedCPUAdam's (ZeRO offload)
    "foreach",  # torch's, with torch_adam
}
OPTIMIZER_PARAMS: dict[str, set[str]] = {
    "adam": _ADAM_PARAMS,
    "adamw": _ADAM_PARAMS,
    "lamb": {"lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "max_coeff", "min_coeff"},
    "onebitadam": {
        "lr", "betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "amsgrad", "freeze_step",
        "cuda_aware", "comm_backend_name",
    },
}  # fmt: skip

_WARMUP = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"}
# scheduler -> (required params, optional params), from docs/design.md §3
SCHEDULER_PARAMS: dict[str, tuple[set[str], set[str]]] = {
    "WarmupLR": (set(), _WARMUP),
    "WarmupDecayLR": ({"total_num_steps"}, _WARMUP),
    "WarmupCosineLR": (
        {"total_num_steps"},
        {"warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type", "last_batch_iteration"},
    ),
    "OneCycle": (
        {"cycle_min_lr", "cycle_max_lr"},
        {
            "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size", "cycle_first_stair_count",
            "cycle_second_stair_count", "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom",
            "decay_mom_rate", "last_batch_iteration",
        },
    ),
    "LRRangeTest": (
        set(),
        {
            "lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate", "lr_range_test_staircase",
            "last_batch_iteration",
        },
    ),
}  # fmt: skip

Rule = Callable[[DSConfig], list[ConfigProblem]]
P = ConfigProblem


def _torch_has(module_name: str, name: str) -> bool:
    module = sys.modules.get(module_name)  # only if the caller already imported torch
    return module is not None and isinstance(getattr(module, name, None), type)


# --------------------------------------------------------------------------------------------- precision
def fp16_with_bf16(cfg: DSConfig) -> list[P]:
    """fp16.enabled and bf16.enabled cannot both be true."""
    if cfg.fp16.enabled and cfg.bf16.enabled:
        return [P("bf16.enabled", "bfloat16 and fp16 modes cannot be simultaneously enabled; "
                  "set fp16.enabled or bf16.enabled to false", True)]  # fmt: skip
    return []


def amp_with_fp16(cfg: DSConfig) -> list[P]:
    """amp.enabled and fp16.enabled cannot both be true."""
    if cfg.amp.enabled and cfg.fp16.enabled:
        return [P("amp.enabled", "cannot enable both amp and (legacy) fp16 mode; "
                  "set amp.enabled or fp16.enabled to false", True)]  # fmt: skip
    return []


def amp_with_bf16(cfg: DSConfig) -> list[P]:
    """amp.enabled and bf16.enabled cannot both be true."""
    if cfg.amp.enabled and cfg.bf16.enabled:
        return [
            P(
                "amp.enabled",
                "cannot enable both amp and bf16; set amp.enabled or bf16.enabled to false",
                True,
            )
        ]
    return []


def amp_with_zero(cfg: DSConfig) -> list[P]:
    """amp cannot be combined with zero_optimization.stage >= 1 (use fp16, like amp O2)."""
    stage = cfg.zero_optimization.stage
    if cfg.amp.enabled and stage > 0:
        return [P("amp.enabled", f"amp and ZeRO (zero_optimization.stage = {stage}) are not compatible; use "
                  "fp16 mode, which performs similar to amp opt_level O2, or set zero_optimization.stage to 0",
                  True)]  # fmt: skip
    return []


def sparse_gradients_with_amp(cfg: DSConfig) -> list[P]:
    """sparse_gradients cannot be combined with amp."""
    if cfg.sparse_gradients and cfg.amp.enabled:
        return [
            P("sparse_gradients", "sparse_gradients cannot be combined with amp (amp.enabled = true)", True)
        ]
    return []


def lamb_needs_dynamic_scale(cfg: DSConfig) -> list[P]:
    """The Lamb optimizer under fp16 needs dynamic loss scaling (fp16.loss_scale 0)."""
    if (
        cfg.optimizer
        and cfg.optimizer.type == "lamb"
        and cfg.fp16.enabled
        and not cfg.fp16.dynamic_loss_scale
    ):
        return [P("fp16.loss_scale", "the Lamb optimizer requires dynamic loss scaling; set fp16.loss_scale to 0",
                  cfg.fp16.loss_scale)]  # fmt: skip
    return []


# --------------------------------------------------------------------------------------------- ZeRO
def offload_rules(cfg: DSConfig) -> list[P]:
    """Optimizer offload needs stage >= 1; parameter offload, partial offload and NVMe optimizer offload need stage
    3; NVMe offload (of either) needs an nvme_path."""
    zero = cfg.zero_optimization
    problems = []
    param = zero.offload_param
    if param is not None and param.device == "nvme" and zero.stage == 3 and not param.nvme_path:
        problems.append(P("zero_optimization.offload_param.nvme_path", "device 'nvme' needs a directory "
                          "for the parameter swap files (on a fast local disk)", param.nvme_path))  # fmt: skip
    if param is not None and param.device != "none" and zero.stage == 0:
        # ZeRO off: the section is inert, as in DeepSpeed (a template config with the stage switched to 0)
        warnings.warn(
            f"zero_optimization.offload_param.device = {param.device!r} has no effect at zero_optimization.stage 0 "
            "(ZeRO is off, so no parameter is partitioned or offloaded); DeepSpeed ignores it too. Set stage to 3 "
            "to offload parameters, or remove offload_param",
            ConfigWarning,
            stacklevel=2,
        )
    elif param is not None and param.device != "none" and zero.stage != 3:
        problems.append(P("zero_optimization.offload_param.device", "parameter offload needs "
                          f"zero_optimization.stage 3 (stage {zero.stage} keeps every parameter whole); set "
                          "stage to 3, or remove offload_param", param.device))  # fmt: skip
    offload = zero.offload_optimizer
    if offload is None:
        return problems
    key = "zero_optimization.cpu_offload" if "cpu_offload" in zero.model_fields_set else (
        "zero_optimization.offload_optimizer.device")  # fmt: skip
    if offload.device == "nvme" and zero.stage in (1, 2):
        # DeepSpeed 0.19.8's stages 1 and 2 quietly take 'nvme' as CPU offload; ds says so instead
        problems.append(P("zero_optimization.offload_optimizer.device", "NVMe optimizer offload needs "
                          f"zero_optimization.stage 3 (stage {zero.stage} would keep the state in CPU memory, "
                          "as DeepSpeed does silently); use 'cpu' or stage 3", "nvme"))  # fmt: skip
    if offload.device == "nvme" and zero.stage == 3 and not offload.nvme_path:
        problems.append(P("zero_optimization.offload_optimizer.nvme_path", "device 'nvme' needs a directory "
                          "for the swap files (on a fast local disk)", offload.nvme_path))  # fmt: skip
    if offload.device != "none" and zero.stage == 0:
        problems.append(P(key, "optimizer offload needs zero_optimization.stage 1, 2 or 3 (stage 0 keeps no "
                          "partition to offload); set stage to 2, or remove the offload", offload.device))  # fmt: skip
    if offload.ratio < 1 and zero.stage != 3:
        problems.append(P("zero_optimization.offload_optimizer.ratio", "partial offloading is only supported "
                          f"with ZeRO stage 3 (stage is {zero.stage}); use 1.0 or stage 3", offload.ratio))  # fmt: skip
    return problems


def zero2_reduce_scatter_scaling(cfg: DSConfig) -> list[P]:
    """Stage 2 with reduce_scatter rejects gradient_predivide_factor != 1 and prescale_gradients."""
    zero = cfg.zero_optimization
    if zero.stage != 2 or not zero.reduce_scatter or cfg.gradient_allreduce_op == "sum":
        return []  # summed gradients are scaled by neither (DeepSpeed asserts only when averaging)
    problems = []
    if cfg.gradient_predivide_factor != 1.0:
        problems.append(P("gradient_predivide_factor", "gradient_predivide_factor != 1.0 is not supported with "
                          "ZeRO stage 2 with zero_optimization.reduce_scatter enabled; set it to 1.0 or "
                          "reduce_scatter to false", cfg.gradient_predivide_factor))  # fmt: skip
    if cfg.prescale_gradients:
        problems.append(P("prescale_gradients", "pre-scaling gradients is not supported with ZeRO stage 2 with "
                          "zero_optimization.reduce_scatter enabled; set it to false or reduce_scatter to false",
                          True))  # fmt: skip
    return problems


def fp32_allreduce_with_zero(cfg: DSConfig) -> list[P]:
    """fp32_allreduce is not supported with ZeRO (stage >= 1), as in DeepSpeed 0.3."""
    stage = cfg.zero_optimization.stage
    if cfg.fp32_allreduce and stage > 0:
        return [P("fp32_allreduce", f"ZeRO (zero_optimization.stage = {stage}) does not support fp32_allreduce: "
                  "true; ZeRO reduces gradients in their own dtype", True)]  # fmt: skip
    return []


def onebitadam_with_zero(cfg: DSConfig) -> list[P]:
    """OneBitAdam works with stage 0 only."""
    stage = cfg.zero_optimization.stage
    if cfg.optimizer and cfg.optimizer.type == "onebitadam" and stage > 0:
        return [P("optimizer.type", f"1-bit Adam is not compatible with ZeRO (zero_optimization.stage = {stage}); "
                  "use zero_optimization.stage 0 (plain data parallel) with OneBitAdam", "OneBitAdam")]  # fmt: skip
    return []


def zero_untested_optimizer(cfg: DSConfig) -> list[P]:
    """ZeRO with an optimizer other than Adam, AdamW, Adagrad needs zero_allow_untested_optimizer: true."""
    opt, stage = cfg.optimizer, cfg.zero_optimization.stage
    if opt is None or stage == 0 or opt.type in _ZERO_TESTED or opt.type == "onebitadam":
        return []
    if cfg.zero_allow_untested_optimizer:
        return []
    return [P("optimizer.type", f"an untested ZeRO optimizer (zero_optimization.stage = {stage}); add "
              '"zero_allow_untested_optimizer": true to the config to use it', opt.type)]  # fmt: skip


def allgather_size_only_with_boolean_zero(cfg: DSConfig) -> list[P]:
    """The top-level allgather_size is only read with the boolean form zero_optimization: true."""
    if "allgather_size" in cfg.model_fields_set:
        return [P("allgather_size", "only read with the deprecated form zero_optimization: true; set "
                  "zero_optimization.allgather_bucket_size instead", cfg.allgather_size)]  # fmt: skip
    return []


# --------------------------------------------------------------------------------------------- optimizer
def optimizer_name(cfg: DSConfig) -> list[P]:
    """optimizer.type must be a known optimizer (the list is in the message)."""
    opt = cfg.optimizer
    if opt is None or opt.type in NATIVE_OPTIMIZERS or opt.type in TORCH_OPTIMIZERS:
        return []
    if _torch_has("torch.optim", opt.type):
        return []
    known = list(NATIVE_OPTIMIZERS.values()) + list(TORCH_OPTIMIZERS)
    close = difflib.get_close_matches(opt.type, known, n=1, cutoff=0.6)
    close += [k for k in known if k.lower() == opt.type.lower()]
    hint = f" Did you mean '{close[-1]}'?" if close else ""
    return [P("optimizer.type", f"not a supported optimizer.{hint} Known: Adam, AdamW, Lamb, OneBitAdam "
              f"(any case) or a torch.optim class spelled exactly: {', '.join(TORCH_OPTIMIZERS)}", opt.type)]  # fmt: skip


def optimizer_params(cfg: DSConfig) -> list[P]:
    """optimizer.params: no max_grad_norm (use gradient_clipping); for native optimizers, known names and sane lr/eps/weight_decay/betas."""
    opt = cfg.optimizer
    if opt is None:
        return []
    problems = []
    if "max_grad_norm" in opt.params:
        problems.append(P("optimizer.params.max_grad_norm", "'max_grad_norm' is not supported as an optimizer "
                          "parameter; use the top-level 'gradient_clipping' instead", opt.params["max_grad_norm"]))  # fmt: skip
    known = OPTIMIZER_PARAMS.get(opt.type)
    if known is not None:
        for name, value in opt.params.items():
            if name != "max_grad_norm" and name not in known:
                problems.append(_unknown_param(f"optimizer.params.{name}", name, value, known, opt.type))
        problems += _number_params(opt.params, "optimizer.params")
    return problems


def _unknown_param(path: str, name: str, value: Any, known: set[str], owner: str) -> P:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(sorted(known))}"
    return P(path, f"not a parameter of {owner}{hint}", value)


def _number_params(params: dict[str, Any], path: str) -> list[P]:
    problems = []
    for name, low, inclusive in (("lr", 0, True), ("eps", 0, False), ("weight_decay", 0, True)):
        if name in params and not _is_number_at_least(params[name], low, inclusive):
            bound = ">=" if inclusive else ">"
            problems.append(P(f"{path}.{name}", f"expected a number {bound} {low}", params[name]))
    betas = params.get("betas")
    if betas is not None and not (
        isinstance(betas, (list, tuple)) and len(betas) == 2 and all(_is_number_at_least(b, 0, True) and b < 1
                                                                     for b in betas)
    ):  # fmt: skip
        problems.append(P(f"{path}.betas", "expected two numbers in [0, 1), e.g. [0.9, 0.999]", betas))
    return problems


def _is_number_at_least(value: Any, low: float, inclusive: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return value >= low if inclusive else value > low


# --------------------------------------------------------------------------------------------- scheduler
def scheduler_name_and_params(cfg: DSConfig) -> list[P]:
    """scheduler.type must be known; native schedulers get their parameter names and required parameters checked."""
    sched = cfg.scheduler
    if sched is None:
        return []
    if sched.type in SCHEDULER_PARAMS:
        return _scheduler_params(sched.type, sched.params)
    if sched.type in TORCH_LR_SCHEDULERS or _torch_has("torch.optim.lr_scheduler", sched.type):
        return []
    known = list(NATIVE_SCHEDULERS) + list(TORCH_LR_SCHEDULERS)
    close = difflib.get_close_matches(sched.type, known, n=1, cutoff=0.6)
    close += [k for k in known if k.lower() == sched.type.lower()]
    hint = f" Did you mean '{close[-1]}'?" if close else ""
    return [P("scheduler.type", f"not a known LR scheduler.{hint} Known: {', '.join(NATIVE_SCHEDULERS)}, "
              f"or a torch.optim.lr_scheduler class: {', '.join(TORCH_LR_SCHEDULERS)}", sched.type)]  # fmt: skip


def _scheduler_params(name: str, params: dict[str, Any]) -> list[P]:
    required, optional = SCHEDULER_PARAMS[name]
    known = required | optional
    problems = [P(f"scheduler.params.{r}", f"required by {name}") for r in sorted(required - params.keys())]
    for key, value in params.items():
        if key not in known:
            problems.append(_unknown_param(f"scheduler.params.{key}", key, value, known, name))
    warmup_type = params.get("warmup_type", "log")
    if "warmup_type" in known and warmup_type not in ("log", "linear"):
        problems.append(P("scheduler.params.warmup_type", "expected 'log' or 'linear'", warmup_type))
    for key in ("warmup_num_steps", "total_num_steps", "cycle_first_step_size", "lr_range_test_step_size"):
        value = params.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            problems.append(P(f"scheduler.params.{key}", "expected an integer >= 0", value))
    return problems


# --------------------------------------------------------------------------------------------- activation ckpt
def contiguous_checkpointing(cfg: DSConfig) -> list[P]:
    """contiguous_memory_optimization needs partition_activations and number_checkpoints."""
    ac = cfg.activation_checkpointing
    if not ac.contiguous_memory_optimization:
        return []
    problems = []
    if not ac.partition_activations:
        problems.append(P("activation_checkpointing.contiguous_memory_optimization", "contiguous checkpointing "
                          "is only available with partitioned activations; set "
                          "activation_checkpointing.partition_activations to true", True))  # fmt: skip
    if ac.number_checkpoints is None:
        problems.append(P("activation_checkpointing.number_checkpoints", "must specify the number of layers "
                          "(number_checkpoints) with contiguous_memory_optimization"))  # fmt: skip
    return problems


# --------------------------------------------------------------------------------------------- sparse attention
_SA = "sparse_attention"


def sparse_attention_rules(cfg: DSConfig) -> list[P]:
    """Section 8's parameter rules: fixed local/global divisibility and pattern counts, horizontal attention only bidirectional, global start/end index lists."""
    sa = cfg.sparse_attention
    problems: list[P] = []
    if isinstance(sa, FixedSparseAttentionConfig):
        problems += _fixed_rules(sa)
    if isinstance(sa, (FixedSparseAttentionConfig, VariableSparseAttentionConfig)):
        if sa.horizontal_global_attention and sa.attention != "bidirectional":
            problems.append(P(f"{_SA}.horizontal_global_attention", 'only "bidirectional" attention can support '
                              f"horizontal global attention (sparse_attention.attention = '{sa.attention}')", True))  # fmt: skip
    if isinstance(sa, (VariableSparseAttentionConfig, BSLongformerSparseAttentionConfig)):
        problems += _global_range_rules(sa.global_block_indices, sa.global_block_end_indices)
    return problems


def _fixed_rules(sa: FixedSparseAttentionConfig) -> list[P]:
    problems = []
    local, glob, patterns = sa.num_local_blocks, sa.num_global_blocks, sa.num_different_global_patterns
    if local % glob != 0:
        problems.append(P(f"{_SA}.num_local_blocks", f"number of blocks in a local window, {local}, must be "
                          f"dividable by number of global blocks (sparse_attention.num_global_blocks), {glob}",
                          local))  # fmt: skip
    if patterns > 1 and not sa.different_layout_per_head:
        problems.append(P(f"{_SA}.num_different_global_patterns", "number of different layouts cannot be more "
                          "than one when you have set a single layout for all heads; set "
                          "sparse_attention.different_layout_per_head to true", patterns))  # fmt: skip
    if patterns > local // glob:
        problems.append(P(f"{_SA}.num_different_global_patterns", f"number of layout versions, {patterns}, "
                          f"cannot be larger than number of local window blocks divided by number of global "
                          f"blocks, {local} / {glob} = {local // glob}", patterns))  # fmt: skip
    return problems


def _global_range_rules(starts: list[int], ends: list[int] | None) -> list[P]:
    if ends is None:
        return []
    if len(starts) != len(ends):
        return [P(f"{_SA}.global_block_end_indices", f"global block start indices length, {len(starts)}, must "
                  f"be same as global block end indices length, {len(ends)}", ends)]  # fmt: skip
    return [
        P(f"{_SA}.global_block_end_indices[{i}]", f"global block start index, {s}, must be smaller than global "
          f"block end index, {e}", e)
        for i, (s, e) in enumerate(zip(starts, ends))
        if s >= e
    ]  # fmt: skip


def sum_allreduce_stage3(cfg: DSConfig) -> list[P]:
    """DeepSpeed 0.19.8 refuses summed gradients at stage 3 (its words)."""
    if cfg.gradient_allreduce_op == "sum" and cfg.zero_optimization.stage == 3:
        return [
            P(
                "gradient_allreduce_op",
                "gradient_allreduce_op='sum' is not supported with ZeRO stage 3",
                "sum",
            )
        ]
    return []


def grad_accum_dtype(cfg: DSConfig) -> list[P]:
    """``data_types.grad_accum_dtype``: its effect goes through ``bf16.grad_accum_dtype`` (set here)."""
    accum = cfg.data_types.grad_accum_dtype
    model = {"fp16": "fp16", "bf16": "bf16"}.get(cfg.precision, "fp32")
    if accum is None or accum == model:
        return []
    if model == "bf16" and accum == "fp32":
        if "grad_accum_dtype" in cfg.bf16.model_fields_set and cfg.bf16.grad_accum_dtype != "fp32":
            return [
                P(
                    "data_types.grad_accum_dtype",
                    f"fp32 contradicts bf16.grad_accum_dtype = {cfg.bf16.grad_accum_dtype!r}; give one of them",
                    accum,
                )
            ]
        cfg.bf16.grad_accum_dtype = "fp32"
        return []
    return [
        P(
            "data_types.grad_accum_dtype",
            f"unsupported mix of model dtype {model} and grad_accum_dtype {accum} (DeepSpeed 0.19.8 refuses it "
            "too without ZeRO); ds accumulates in the model's dtype, or in fp32 with bf16 training",
            accum,
        )
    ]


# --------------------------------------------------------------------------------------------- tensor parallel
def tp_size_matches_autotp(cfg: DSConfig) -> list[P]:
    """tensor_parallel.tp.tp_size is 1 or autotp_size (DeepSpeed's check)."""
    tp = cfg.tensor_parallel
    if tp.tp.tp_size not in (1, tp.autotp_size):
        return [P("tensor_parallel.tp.tp_size", f"({tp.tp.tp_size}) does not match tensor_parallel.autotp_size "
                  f"({tp.autotp_size}); remove it or make them equal", tp.tp.tp_size)]  # fmt: skip
    return []


RULES: tuple[Rule, ...] = (
    fp16_with_bf16,
    amp_with_fp16,
    amp_with_bf16,
    amp_with_zero,
    sparse_gradients_with_amp,
    lamb_needs_dynamic_scale,
    offload_rules,
    zero2_reduce_scatter_scaling,
    fp32_allreduce_with_zero,
    onebitadam_with_zero,
    zero_untested_optimizer,
    allgather_size_only_with_boolean_zero,
    optimizer_name,
    optimizer_params,
    scheduler_name_and_params,
    contiguous_checkpointing,
    sparse_attention_rules,
    grad_accum_dtype,
    sum_allreduce_stage3,
    tp_size_matches_autotp,
)


def check_rules(cfg: DSConfig) -> list[ConfigProblem]:
    """Every cross-key problem of ``cfg``, in rule order."""
    return [problem for rule in RULES for problem in rule(cfg)]
