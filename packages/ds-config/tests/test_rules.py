"""One test per cross-key rule: the config fragment, the key path named, and the words of the message."""

import pytest
from ds_config import ConfigError, load_config

BASE = {"train_batch_size": 8}


def _problems(fragment, **kwargs):
    with pytest.raises(ConfigError) as info:
        load_config({**BASE, **fragment}, **kwargs)
    return info.value


ZERO2 = {"zero_optimization": {"stage": 2}}
ADAM = {"optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}

# (fragment, path named, words the message must contain)
RULES = [
    pytest.param({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "bf16.enabled",
                 "cannot be simultaneously enabled", id="fp16+bf16"),
    pytest.param({"amp": {"enabled": True}, "fp16": {"enabled": True}}, "amp.enabled", "amp and (legacy) fp16",
                 id="amp+fp16"),
    pytest.param({"amp": {"enabled": True}, "bf16": {"enabled": True}}, "amp.enabled", "amp and bf16",
                 id="amp+bf16"),
    pytest.param({"amp": {"enabled": True, "opt_level": "O2"}, **ZERO2, **ADAM}, "amp.enabled",
                 "zero_optimization.stage = 2", id="amp+zero"),
    pytest.param({"sparse_gradients": True, "amp": {"enabled": True}}, "sparse_gradients",
                 "cannot be combined with amp", id="sparse_gradients+amp"),
    pytest.param({"zero_optimization": {"stage": 4}}, "zero_optimization.stage", "<= 3", id="stage4"),
    pytest.param({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}, **ADAM},
                 "zero_optimization.offload_param.device", "stage 3", id="offload_param-stage2"),
    pytest.param({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}, **ADAM},
                 "zero_optimization.offload_param.nvme_path", "directory", id="offload_param-nvme-no-path"),
    pytest.param({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True,
                                        "stage3_gather_fp16_weights_on_model_save": True}, **ADAM},
                 "zero_optimization", "deprecated", id="gather16+gatherfp16"),
    pytest.param({"zero_optimization": {"stage": -1}}, "zero_optimization.stage", ">= 0", id="stage-negative"),
    pytest.param({"zero_optimization": {"stage": 2, "cpu_offload": True, "offload_optimizer": {"device": "cpu"}}},
                 "zero_optimization", "'zero_optimization.cpu_offload' and its replacement", id="cpu_offload+offload"),
    pytest.param({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
                 "zero_optimization.offload_optimizer.device", "stage 1, 2 or 3", id="offload-stage0"),
    pytest.param({"zero_optimization": {"cpu_offload": True}}, "zero_optimization.cpu_offload", "stage 1, 2 or 3",
                 id="cpu_offload-stage0"),
    pytest.param({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}, **ADAM},
                 "zero_optimization.offload_optimizer.device", "needs zero_optimization.stage 3", id="offload-nvme"),
    pytest.param({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}, **ADAM},
                 "zero_optimization.offload_optimizer.nvme_path", "directory", id="offload-nvme-no-path"),
    pytest.param({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}, **ADAM},
                 "zero_optimization.offload_optimizer.ratio", "partial offloading", id="offload-ratio"),
    pytest.param({**ZERO2, **ADAM, "gradient_predivide_factor": 2.0}, "gradient_predivide_factor",
                 "reduce_scatter", id="zero2-predivide"),
    pytest.param({**ZERO2, **ADAM, "prescale_gradients": True}, "prescale_gradients", "reduce_scatter",
                 id="zero2-prescale"),
    pytest.param({"zero_optimization": {"stage": 1}, **ADAM, "fp32_allreduce": True}, "fp32_allreduce",
                 "does not support fp32_allreduce", id="zero+fp32_allreduce"),
    pytest.param({"zero_optimization": {"stage": 1}, "optimizer": {"type": "OneBitAdam"}}, "optimizer.type",
                 "1-bit Adam is not compatible with ZeRO", id="onebitadam+zero1"),
    pytest.param({**ZERO2, "optimizer": {"type": "onebitadam"}}, "optimizer.type",
                 "zero_optimization.stage = 2", id="onebitadam+zero2"),
    pytest.param({**ZERO2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}, "optimizer.type",
                 "zero_allow_untested_optimizer", id="zero-untested-optimizer"),
    pytest.param({"optimizer": {"type": "Adamm"}}, "optimizer.type", "Did you mean 'Adam'", id="unknown-optimizer"),
    pytest.param({"optimizer": {"type": "sgd"}}, "optimizer.type", "Did you mean 'SGD'", id="torch-name-case"),
    pytest.param({"optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}},
                 "optimizer.params.max_grad_norm", "gradient_clipping", id="max_grad_norm"),
    pytest.param({"optimizer": {"type": "Adam", "params": {"weight_decy": 0.1}}}, "optimizer.params.weight_decy",
                 "did you mean 'weight_decay'", id="optimizer-param-typo"),
    pytest.param({"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}}, "optimizer.params.betas",
                 "two numbers", id="optimizer-betas"),
    pytest.param({"optimizer": {"type": "Adam", "params": {"lr": -1}}}, "optimizer.params.lr", ">= 0",
                 id="optimizer-lr-negative"),
    pytest.param({"optimizer": {"type": "Lamb"}, "fp16": {"enabled": True, "loss_scale": 128}}, "fp16.loss_scale",
                 "dynamic loss scaling", id="lamb-static-scale"),
    pytest.param({"scheduler": {"type": "WarmupLRR"}}, "scheduler.type", "Did you mean 'WarmupLR'",
                 id="unknown-scheduler"),
    pytest.param({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}},
                 "scheduler.params.total_num_steps", "required by WarmupDecayLR", id="scheduler-required"),
    pytest.param({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1,
                                                               "cycle_first_stepsize": 4}}},
                 "scheduler.params.cycle_first_stepsize", "did you mean 'cycle_first_step_size'",
                 id="scheduler-param-typo"),
    pytest.param({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}},
                 "scheduler.params.warmup_type", "'log' or 'linear'", id="warmup-type"),
    pytest.param({"activation_checkpointing": {"contiguous_memory_optimization": True, "number_checkpoints": 4}},
                 "activation_checkpointing.contiguous_memory_optimization", "partition_activations",
                 id="contiguous-without-partition"),
    pytest.param({"activation_checkpointing": {"contiguous_memory_optimization": True,
                                               "partition_activations": True}},
                 "activation_checkpointing.number_checkpoints", "number of layers", id="contiguous-without-count"),
    pytest.param({"checkpoint": {"tag_validation": "Maybe"}}, "checkpoint.tag_validation",
                 "'Warn', 'Ignore' or 'Fail'", id="tag-validation"),
    pytest.param({"allgather_size": 1000}, "allgather_size", "zero_optimization.allgather_bucket_size",
                 id="allgather_size-without-boolean-zero"),
]  # fmt: skip


@pytest.mark.parametrize(("fragment", "path", "words"), RULES)
def test_rule(fragment, path, words):
    error = _problems(fragment)
    matching = [p for p in error.problems if p.path == path]
    assert matching, f"no problem at {path}: {error}"
    assert any(words in str(p) for p in matching), str(error)


SPARSE = [
    pytest.param({"num_local_blocks": 4, "num_global_blocks": 3}, "sparse_attention.num_local_blocks",
                 "dividable by number of global blocks", id="fixed-local-global"),
    pytest.param({"attention": "unidirectional", "horizontal_global_attention": True},
                 "sparse_attention.horizontal_global_attention", '"bidirectional"', id="fixed-horizontal-uni"),
    pytest.param({"num_different_global_patterns": 2}, "sparse_attention.num_different_global_patterns",
                 "different_layout_per_head", id="fixed-patterns-single-layout"),
    pytest.param({"num_different_global_patterns": 5, "different_layout_per_head": True},
                 "sparse_attention.num_different_global_patterns", "cannot be larger", id="fixed-patterns-too-many"),
    pytest.param({"attention": "sideways"}, "sparse_attention.attention", "'unidirectional' or 'bidirectional'",
                 id="fixed-attention-type"),
    pytest.param({"mode": "variable", "global_block_indices": [0, 4], "global_block_end_indices": [2]},
                 "sparse_attention.global_block_end_indices", "length, 2, must be same", id="variable-end-length"),
    pytest.param({"mode": "variable", "global_block_indices": [3], "global_block_end_indices": [3]},
                 "sparse_attention.global_block_end_indices[0]", "must be smaller", id="variable-start-ge-end"),
    pytest.param({"mode": "variable", "local_window_blocks": []}, "sparse_attention.local_window_blocks",
                 "at least 1", id="variable-empty-windows"),
    pytest.param({"mode": "variable", "attention": "unidirectional", "horizontal_global_attention": True},
                 "sparse_attention.horizontal_global_attention", '"bidirectional"', id="variable-horizontal-uni"),
    pytest.param({"mode": "bslongformer", "global_block_indices": [5], "global_block_end_indices": [1]},
                 "sparse_attention.global_block_end_indices[0]", "must be smaller", id="bslongformer-start-ge-end"),
    pytest.param({"mode": "bigbird", "num_local_blocks": 8}, "sparse_attention.num_local_blocks",
                 "used by mode 'fixed'", id="other-mode-key"),
    pytest.param({"mode": "fixed", "num_sliding_window_blocks": 5}, "sparse_attention.num_sliding_window_blocks",
                 "modes 'bigbird', 'bslongformer'", id="other-modes-key"),
    pytest.param({"mode": "dense", "num_global_blocks": 2}, "sparse_attention.num_global_blocks",
                 "modes 'fixed', 'bigbird'", id="dense-other-mode-key"),
    pytest.param({"mode": "sparse"}, "sparse_attention", "mode must be one of", id="unknown-mode"),
    pytest.param({"block": 0}, "sparse_attention.block", ">= 1", id="block-bound"),
    pytest.param({"mode": "variable", "num_random_blocks": -1}, "sparse_attention.num_random_blocks", ">= 0",
                 id="random-bound"),
    pytest.param({"mode": "fixed", "num_locl_blocks": 2}, "sparse_attention.num_locl_blocks",
                 "did you mean 'sparse_attention.num_local_blocks'", id="typo"),
]  # fmt: skip


@pytest.mark.parametrize(("section", "path", "words"), SPARSE)
def test_sparse_attention_rule(section, path, words):
    error = _problems({"sparse_attention": section})
    matching = [p for p in error.problems if p.path == path]
    assert matching, f"no problem at {path}: {error}"
    assert any(words in str(p) for p in matching), str(error)


@pytest.mark.parametrize(
    "fragment",
    [
        {
            "zero_optimization": {"stage": 2, "reduce_scatter": False},
            **ADAM,
            "gradient_predivide_factor": 2.0,
        },
        {"zero_optimization": {"stage": 1}, **ADAM, "prescale_gradients": True},
        {
            "zero_optimization": {"stage": 2},
            "optimizer": {"type": "SGD"},
            "zero_allow_untested_optimizer": True,
        },
        {"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}, **ADAM},
        {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}, **ADAM},
        {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"},
                               "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}, **ADAM},
        {"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 400, "cuda_aware": True}}},
        {"optimizer": {"type": "Lamb"}, "fp16": {"enabled": True}},
        {"optimizer": {"type": "RMSprop"}, "scheduler": {"type": "StepLR", "params": {"step_size": 10}}},
        {"amp": {"enabled": True, "opt_level": "O2", "keep_batchnorm_fp32": True, "custom_apex_key": 1}},
        {"sparse_attention": {"mode": "bigbird", "attention": "unidirectional", "num_random_blocks": 2}},
    ],
)
def test_allowed_neighbours_of_rules(fragment):
    load_config({**BASE, **fragment})


def test_all_problems_reported_at_once():
    error = _problems({"fp16": {"enabled": True}, "bf16": {"enabled": True}, "optimizer": {"type": "Nope"},
                       "scheduler": {"type": "Never"}, "train_micro_batch_size_per_gpu": 3})  # fmt: skip
    assert {"bf16.enabled", "optimizer.type", "scheduler.type", "train_batch_size"} <= set(error.paths)


def test_field_problems_reported_at_once():
    error = _problems(
        {"fp16": {"loss_scale": -1, "hysteresis": "x"}, "steps_per_print": 0, "gradient_clipping": "x"}
    )
    assert set(error.paths) == {"fp16.loss_scale", "fp16.hysteresis", "steps_per_print", "gradient_clipping"}


def test_torch_optimizer_names_are_case_sensitive_and_kept_verbatim():
    cfg = load_config({**BASE, "optimizer": {"type": "SGD"}})
    assert cfg.optimizer.type == "SGD"
    cfg = load_config({**BASE, "optimizer": {"type": "ONEBITADAM"}})
    assert cfg.optimizer.type == "onebitadam"


def test_batch_sizes_checked_even_when_a_section_is_invalid():
    error = _problems({"train_micro_batch_size_per_gpu": 3.0, "fp16": {"enabled": "yes"}})
    assert error.paths == ["fp16.enabled", "train_batch_size"]
    assert "8 != 3 * 2 * 1" in str(error)


def test_stage3_keys_load_with_deepspeed_defaults():
    cfg = load_config({"train_batch_size": 8, "zero_optimization": {"stage": 3}, **ADAM})
    zero = cfg.zero_optimization
    assert zero.stage == 3
    assert zero.stage3_prefetch_bucket_size == 50_000_000
    assert zero.stage3_param_persistence_threshold == 100_000
    assert zero.stage3_max_live_parameters == 1_000_000_000
    assert zero.stage3_max_reuse_distance == 1_000_000_000
    assert zero.sub_group_size == 1_000_000_000
    assert zero.stage3_gather_16bit_weights_on_model_save is False and zero.offload_param is None
    old = load_config({"train_batch_size": 8, **ADAM, "zero_optimization": {
        "stage": 3, "stage3_gather_fp16_weights_on_model_save": True, "offload_param": {"device": "cpu"},
        "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})  # fmt: skip
    assert old.zero_optimization.stage3_gather_16bit_weights_on_model_save is True
    assert old.zero_optimization.offload_param.device == "cpu"


def test_offload_param_at_stage_0_is_ignored_with_a_warning_as_deepspeed_does():
    from ds_config import ConfigWarning

    with pytest.warns(
        ConfigWarning, match=r"offload_param.device = 'cpu' has no effect at zero_optimization.stage 0"
    ):
        cfg = load_config(
            {"train_batch_size": 8, "zero_optimization": {"stage": 0, "offload_param": {"device": "cpu"}}}
        )
    assert cfg.zero_optimization.stage == 0
