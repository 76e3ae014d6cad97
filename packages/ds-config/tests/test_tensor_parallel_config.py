"""The ``tensor_parallel`` section (AutoTP training): DeepSpeed 0.19.8's keys, spellings and checks."""

from __future__ import annotations

import pytest
from ds_config import NO_EFFECT, ConfigError, load_config

BASE = {"train_batch_size": 8}


def _tp(section):
    return load_config({**BASE, "tensor_parallel": section}).tensor_parallel


def test_defaults_are_deepspeeds():
    tp = load_config(BASE).tensor_parallel
    assert tp.autotp_size == 0 and tp.tp_overlap_comm is False and tp.vocab_parallel_lm_head is None
    assert (
        tp.tp.tp_size == 1 and tp.partition_config is None and tp.preset_model is None and tp.dtype == "fp16"
    )


def test_deepspeed_spellings_of_the_group_section_and_kernel_inject():
    tp = _tp({"autotp_size": 2, "tensor_parallel": {"tp_size": 2}, "kernel_inject": False})
    assert tp.tp.tp_size == 2 and tp.replace_with_kernel_inject is False
    with pytest.raises(ConfigError, match="another name"):
        _tp({"tp": {}, "tensor_parallel": {}})


def test_layer_specs_parse_with_deepspeeds_example():
    tp = _tp(
        {
            "autotp_size": 2,
            "partition_config": {
                "use_default_specs": False,
                "layer_specs": [
                    {
                        "patterns": [r".*\.o_proj\.weight$", r".*\.down_proj\.weight$"],
                        "partition_type": "row",
                    },
                    {"patterns": [r".*\.[qkv]_proj\.weight$"], "partition_type": "COLUMN"},
                    {"patterns": [r".*\.gate_up_proj\.weight$"], "shape": [2, -1], "partition_dim": 0},
                ],
            },
        }
    )
    specs = tp.partition_config.layer_specs
    assert [s.partition_type for s in specs] == ["row", "column", "column"] and specs[2].shape == [2, -1]


@pytest.mark.parametrize(
    ("section", "path", "words"),
    [
        ({"autotp_size": 2, "tp": {"tp_size": 4}}, "tensor_parallel.tp.tp_size", "does not match"),
        ({"autotp_size": -1}, "tensor_parallel.autotp_size", ">= 0"),
        ({"vocab_parallel_ce_backend": "liger"}, "vocab_parallel_ce_backend", "Liger"),
        ({"kernel_inject": True}, "replace_with_kernel_inject", "inference kernels"),
        ({"tp": {"tp_group": "g"}}, "tensor_parallel.tp.tp_group", "autotp_size"),
        ({"dtype": "int8"}, "tensor_parallel.dtype", "fp16, bf16, fp32"),
        ({"preset_model": "gpt9"}, "tensor_parallel.preset_model", "llama"),
        (
            {"partition_config": {"layer_specs": [{"patterns": ["x"], "partition_type": "diag"}]}},
            "partition_type",
            "row",
        ),
        ({"partition_config": {"layer_specs": [{"partition_type": "row"}]}}, "patterns", "required"),
        ({"autotp": 2}, "tensor_parallel.autotp", "autotp_size"),
    ],
)
def test_bad_values_name_the_key(section, path, words):
    with pytest.raises(ConfigError) as err:
        _tp(section)
    assert path in str(err.value) and words in str(err.value)


def test_torch_dtype_spellings_are_read():
    assert _tp({"dtype": "torch.bfloat16"}).dtype == "bf16" and _tp({"dtype": "float32"}).dtype == "fp32"


def test_every_no_effect_key_has_a_reason():
    keys = [k for k in NO_EFFECT if k.startswith("tensor_parallel.")]
    assert "tensor_parallel.tp.tp_grain_size" in keys and all(NO_EFFECT[k] for k in keys)
