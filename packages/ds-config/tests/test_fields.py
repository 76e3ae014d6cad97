"""leaf_paths, the NO_EFFECT table's warning, and the ConfigReads test helper."""

import warnings

import pytest
from ds_config import NO_EFFECT, ConfigWarning, FP16Config, ZeroConfig, leaf_paths, load_config
from ds_config.testing import ConfigReads


def test_leaf_paths_walk_nested_sections_and_every_sparse_mode():
    paths = leaf_paths()
    assert "zero_optimization.offload_optimizer.pin_memory" in paths
    assert "sparse_attention.num_sliding_window_blocks" in paths  # bigbird / bslongformer only
    assert (
        "optimizer.params" in paths
        and "fp16" not in paths
        and "zero_optimization.offload_optimizer" not in paths
    )
    assert set(NO_EFFECT) <= set(paths)


def _no_effect_warnings(config: dict) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config({"train_batch_size": 1, **config})
    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, ConfigWarning) and "no effect" in str(w.message)
    ]


def test_a_no_effect_key_set_away_from_its_default_warns_once_with_the_reason():
    messages = _no_effect_warnings({"zero_optimization": {"stage": 1, "elastic_checkpoint": True}})
    assert len(messages) == 1
    assert messages[0].startswith("zero_optimization.elastic_checkpoint = True has no effect in ds: ")
    assert NO_EFFECT["zero_optimization.elastic_checkpoint"] in messages[0]


def test_a_no_effect_key_at_its_default_is_silent():
    assert _no_effect_warnings({"zero_optimization": {"elastic_checkpoint": False}}) == []
    offload = {"stage": 3, "offload_optimizer": {"device": "cpu", "fast_init": False}}
    assert _no_effect_warnings({"zero_optimization": offload}) == []
    offload["offload_optimizer"]["fast_init"] = True
    assert _no_effect_warnings({"zero_optimization": offload}) == [
        "zero_optimization.offload_optimizer.fast_init = True has no effect in ds: "
        + NO_EFFECT["zero_optimization.offload_optimizer.fast_init"]
    ]


def test_config_reads_records_leaf_reads_and_keeps_the_types():
    reads = ConfigReads()
    original = load_config({"train_batch_size": 1, "zero_optimization": {"stage": 1, "cpu_offload": True}})
    cfg = reads.wrap(original)
    assert isinstance(cfg.fp16, FP16Config) and isinstance(cfg.zero_optimization, ZeroConfig)
    assert cfg.batch == original.batch  # private state survives
    assert cfg.zero_optimization.offload_device == "cpu"  # a property reads for its caller
    assert cfg.fp16.loss_scale == 0
    assert reads.read_by(__name__.split(".")[0]) == {
        "zero_optimization.offload_optimizer.device",
        "fp16.loss_scale",
    }
    assert type(original.fp16) is FP16Config  # the original is untouched


def test_config_reads_check_names_undeclared_and_unread_paths():
    reads = ConfigReads()
    cfg = reads.wrap(load_config({"train_batch_size": 1}))
    _ = cfg.fp16.hysteresis
    me = __name__.split(".")[0]
    reads.check(me, ["fp16.hysteresis"])
    with pytest.raises(AssertionError, match=r"read but missing from .*\['fp16.hysteresis'\]"):
        reads.check(me, [])
    with pytest.raises(AssertionError, match=r"never read .*\['bf16.enabled'\]"):
        reads.check(me, ["fp16.hysteresis", "bf16.enabled"])
    with pytest.raises(AssertionError, match="not DSConfig leaves"):
        reads.check(me, ["fp16.hysteresis", "fp16.hysterisis"])
