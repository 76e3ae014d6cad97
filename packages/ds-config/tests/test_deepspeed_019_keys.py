"""DeepSpeed 0.19 keys in the wild: accepted at their default/disabled values, an error naming the feature
otherwise; unknown keys are strict errors that non-strict loading turns into warnings."""

from __future__ import annotations

import warnings

import pytest
from ds_config import ConfigError, ConfigWarning, load_config

BASE = {"train_batch_size": 8}

# A config as DeepSpeed's current examples write it: every optional feature listed at its default.
CURRENT_EXAMPLE = {
    **BASE,
    "fp16": {"enabled": False, "auto_cast": False, "fp16_master_weights_and_grads": False, "loss_scale": 0},
    "bf16": {"enabled": True, "immediate_grad_update": False, "check_grad_overflow": True},
    "flops_profiler": {
        "enabled": False,
        "profile_step": 1,
        "module_depth": -1,
        "top_modules": 1,
        "detailed": True,
    },
    "comms_logger": {"enabled": False, "verbose": False, "prof_all": True, "debug": False},
    "tensorboard": {"enabled": False, "output_path": "", "job_name": "DeepSpeedJobName"},
    "wandb": {"enabled": False, "project": "deepspeed"},
    "csv_monitor": {"enabled": False},
    "comet": {"enabled": False},
    "torch_autocast": {"enabled": False},
    "progressive_layer_drop": {"enabled": False, "theta": 0.5, "gamma": 0.001},
    "curriculum_learning": {"enabled": False, "curriculum_type": "seqlen"},
    "data_efficiency": {"enabled": False, "data_sampling": {"enabled": False}},
    "eigenvalue": {"enabled": False},
    "autotuning": {"enabled": False},
    "hybrid_engine": {"enabled": False},
    "disable_allgather": False,
    "memory_breakdown": False,
    "zero_force_ds_cpu_optimizer": True,
    "dataloader_drop_last": True,
}


def test_a_config_listing_deepspeed_defaults_loads_unchanged():
    cfg = load_config(CURRENT_EXAMPLE)
    assert cfg.bf16.enabled and not cfg.flops_profiler.enabled and cfg.dataloader_drop_last


@pytest.mark.parametrize(
    ("section", "feature"),
    [
        ({"fp16": {"enabled": True, "fp16_master_weights_and_grads": True}}, "fp16 master weights"),
        ({"fp16": {"auto_cast": True}}, "fp16.auto_cast"),
        ({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}}, "bf16 master weights"),
        ({"flops_profiler": {"enabled": True}}, "FLOPs profiler"),
        ({"comms_logger": {"enabled": True}}, "communication logger"),
        ({"wandb": {"enabled": True}}, "Weights & Biases"),
        ({"comet": {"enabled": True}}, "Comet"),
        ({"torch_autocast": {"enabled": True}}, "torch autocast"),
        ({"curriculum_learning": {"enabled": True}}, "curriculum learning"),
        ({"memory_breakdown": True}, "memory_breakdown"),
        ({"disable_allgather": True}, "disable_allgather"),
    ],
)
def test_an_enabled_feature_ds_lacks_is_an_error_naming_it(section, feature):
    for strict in (True, False):  # leniency never covers an enabled feature
        with pytest.raises(ConfigError, match=feature) as info:
            load_config({**BASE, **section}, strict=strict)
        assert info.value.paths[0].split(".")[0] == next(iter(section))


def test_an_unknown_sub_key_of_a_modelled_section_is_still_caught():
    with pytest.raises(
        ConfigError, match="flops_profiler.profile_stp.*did you mean 'flops_profiler.profile_step'"
    ):
        load_config({**BASE, "flops_profiler": {"enabled": False, "profile_stp": 1}})


def test_unknown_keys_are_marked_strict_only_and_warn_when_lenient():
    with pytest.raises(ConfigError) as info:
        load_config({**BASE, "zero_quantized_weights": False})
    assert [p.strict_only for p in info.value.problems] == [True]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config({**BASE, "zero_quantized_weights": False}, strict=False)
    assert any(
        issubclass(w.category, ConfigWarning) and "zero_quantized_weights" in str(w.message) for w in caught
    )


def test_every_accepted_019_key_has_a_no_effect_reason():
    from ds_config._compat import compat_no_effect

    table = compat_no_effect()
    assert "flops_profiler.profile_step" in table and "fp16.fp16_master_weights_and_grads" in table
    assert all("tensorboard" not in k and "csv_monitor" not in k for k in table)  # those two work


@pytest.mark.parametrize("value", ["sum", "SUM"])
def test_gradient_allreduce_op_sum_at_stages_0_to_2_refused_at_3(value):
    # DeepSpeed 0.19.8 takes "sum" (summed, not averaged, data-parallel gradients) at stages 0-2 and refuses
    # it at stage 3 (its words); the effect is tested at 2 ranks in packages/deepspeed/tests/test_gradient_sum.py
    for stage in (0, 1, 2):
        cfg = load_config({**BASE, "gradient_allreduce_op": value, "zero_optimization": {"stage": stage}})
        assert cfg.gradient_allreduce_op == "sum"
    with pytest.raises(ConfigError, match="gradient_allreduce_op='sum' is not supported with ZeRO stage 3"):
        load_config({**BASE, "gradient_allreduce_op": value, "zero_optimization": {"stage": 3}})
    assert load_config({**BASE, "gradient_allreduce_op": "MEAN"}).gradient_allreduce_op == "mean"
