"""Realistic whole configs: the reference's examples, ZeRO-2 fp16, bf16, sparse attention, OneBitAdam, HF "auto"."""

import json
from pathlib import Path

import pytest
from ds_config import (
    BigBirdSparseAttentionConfig,
    ConfigError,
    FixedSparseAttentionConfig,
    load_config,
)

CONFIGS = Path(__file__).parent / "configs"
VALID = sorted(p.name for p in CONFIGS.glob("*.json") if p.name != "hf_auto.json")


@pytest.mark.parametrize("name", VALID)
def test_example_configs_validate(name):
    cfg = load_config(CONFIGS / name, world_size=4)
    b = cfg.batch
    assert b.train_batch_size == b.train_micro_batch_size_per_gpu * b.gradient_accumulation_steps * 4


def test_reference_examples_together():
    cfg = load_config(CONFIGS / "reference_all_examples.json", world_size=4)
    assert (cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (8, 1)
    assert cfg.optimizer.type == "adam" and cfg.optimizer.params["betas"] == [0.8, 0.999]
    assert cfg.scheduler.type == "WarmupLR" and cfg.fp16.initial_scale_power == 32
    assert cfg.zero_optimization.stage == 2 and cfg.zero_optimization.offload_device == "none"
    sa = cfg.sparse_attention
    assert isinstance(sa, FixedSparseAttentionConfig)
    assert (sa.num_different_global_patterns, sa.different_layout_per_head) == (4, True)
    assert not hasattr(sa, "global_block_end_indices")  # a variable/bslongformer key, given as null


def test_zero2_fp16():
    cfg = load_config(CONFIGS / "zero2_fp16.json", world_size=8)
    z = cfg.zero_optimization
    assert (cfg.gradient_accumulation_steps, z.stage, z.reduce_bucket_size, z.offload_device) == (
        4,
        2,
        200_000_000,
        "cpu",
    )
    assert cfg.fp16.initial_scale_power == 16 and cfg.checkpoint.tag_validation == "Fail"
    assert cfg.precision == "fp16"


def test_bf16():
    cfg = load_config(CONFIGS / "bf16.json", world_size=2)
    assert cfg.precision == "bf16" and cfg.bf16.grad_accum_dtype == "fp32"
    assert cfg.train_batch_size == 32 and cfg.optimizer.type == "lamb"


def test_sparse_attention_bigbird():
    cfg = load_config(CONFIGS / "sparse_attention_bigbird.json")
    sa = cfg.sparse_attention
    assert isinstance(sa, BigBirdSparseAttentionConfig)
    assert (sa.num_random_blocks, sa.num_sliding_window_blocks, sa.num_global_blocks, sa.block) == (
        3,
        3,
        2,
        16,
    )


def test_onebitadam():
    cfg = load_config(CONFIGS / "reference_onebitadam.json", world_size=2)
    assert cfg.optimizer.type == "onebitadam" and cfg.optimizer.params["freeze_step"] == 400
    assert cfg.train_batch_size == 16


def test_amp():
    cfg = load_config(CONFIGS / "reference_amp.json", world_size=2)
    assert cfg.precision == "amp" and cfg.gradient_accumulation_steps == 2


HF_AUTO_PATHS = [
    "fp16.enabled", "bf16.enabled", "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps",
    "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps", "zero_optimization.reduce_bucket_size", "gradient_accumulation_steps",
    "gradient_clipping", "train_batch_size", "train_micro_batch_size_per_gpu",
]  # fmt: skip


def test_hf_auto_lists_every_auto_key():
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "hf_auto.json")
    assert info.value.paths == HF_AUTO_PATHS


def test_hf_auto_resolved():
    values = {
        "fp16.enabled": False, "bf16.enabled": True, "optimizer.params.lr": 5e-5, "optimizer.params.betas": [0.9, 0.999],
        "optimizer.params.eps": 1e-8, "optimizer.params.weight_decay": 0.0, "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": 5e-5, "scheduler.params.warmup_num_steps": 500,
        "zero_optimization.reduce_bucket_size": 4096 * 4096, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 8,
    }  # fmt: skip
    cfg = load_config(CONFIGS / "hf_auto.json", world_size=4, auto_values=values)
    assert cfg.precision == "bf16" and cfg.zero_optimization.reduce_bucket_size == 4096 * 4096
    assert json.loads(cfg.model_dump_json())["optimizer"]["params"]["lr"] == 5e-5
