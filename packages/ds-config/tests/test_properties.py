"""Property tests: whatever the input, load_config returns a DSConfig or raises ConfigError, nothing else."""

import copy
import json
from pathlib import Path

import pytest
from ds_config import ConfigError, DSConfig, derive_batch_sizes, load_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BASE = json.loads((Path(__file__).parent / "configs" / "zero2_fp16.json").read_text())

json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=True) | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=6,
)
# Real top-level keys as well as random ones, so the values reach the section models.
top_keys = st.sampled_from(sorted(DSConfig.model_fields)) | st.text(max_size=6)


def _leaf_paths(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaf_paths(value, (*prefix, key))
    else:
        yield prefix


def _get(config, path):
    for key in path:
        config = config[key]
    return config


# Leaves validated by the models (not the free-form params dicts) whose value is a number or a bool.
LEAVES = [p for p in _leaf_paths(BASE) if p[1:2] != ("params",) and not isinstance(_get(BASE, p), str)]


def _set(config, path, value):
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _numeric(text: str) -> bool:
    """A number written as a string: DeepSpeed 0.19.8 converts it for the fp16 scaler's settings (recorded)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


@SETTINGS
@given(data=st.dictionaries(top_keys, json_values, max_size=5))
def test_arbitrary_dicts_only_raise_config_error(data):
    try:
        assert isinstance(load_config(data), DSConfig)
    except ConfigError as error:
        assert error.problems


@SETTINGS
@given(
    path=st.sampled_from(LEAVES),
    value=st.text(min_size=1, max_size=6).filter(lambda s: s != "auto" and not _numeric(s)),
)
def test_a_string_where_a_number_or_bool_belongs_is_a_config_error(path, value):
    config = copy.deepcopy(BASE)
    _set(config, path, value)
    with pytest.raises(ConfigError) as info:
        load_config(config, world_size=8)
    assert ".".join(path) in info.value.paths


@SETTINGS
@given(
    path=st.sampled_from(LEAVES), key=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)
)
def test_an_unknown_key_is_named_by_its_dotted_path(path, key):
    config = copy.deepcopy(BASE)
    parent = path[:-1]
    node = config
    for part in parent:
        node = node[part]
    if key in node or (not parent and key in DSConfig.model_fields):
        return
    node[key] = 1
    with pytest.raises(ConfigError) as info:
        load_config(config, world_size=8)
    assert ".".join((*parent, key)) in info.value.paths


@SETTINGS
@given(
    tbs=st.none() | st.integers(-4, 300),
    mbs=st.none() | st.integers(-4, 40),
    gas=st.none() | st.integers(-4, 40),
    world=st.integers(1, 16),
)
def test_batch_derivation_is_consistent_or_a_config_error(tbs, mbs, gas, world):
    try:
        b = derive_batch_sizes(tbs, mbs, gas, world)
    except ConfigError as error:
        assert len(error.problems) == 1
        return
    assert b.train_batch_size == b.train_micro_batch_size_per_gpu * b.gradient_accumulation_steps * world
    assert min(b.train_batch_size, b.train_micro_batch_size_per_gpu, b.gradient_accumulation_steps) > 0
    for given_value, derived in ((tbs, b.train_batch_size), (mbs, b.train_micro_batch_size_per_gpu),
                                 (gas, b.gradient_accumulation_steps)):  # fmt: skip
        assert given_value is None or given_value == derived


@SETTINGS
@given(sparse=st.dictionaries(
    st.sampled_from(["mode", "block", "num_local_blocks", "num_global_blocks", "attention", "num_random_blocks",
                     "local_window_blocks", "global_block_indices", "global_block_end_indices",
                     "num_sliding_window_blocks", "num_different_global_patterns", "different_layout_per_head",
                     "horizontal_global_attention"]),
    st.sampled_from(["fixed", "variable", "bigbird", "bslongformer", "dense", "unidirectional"])
    | st.integers(-2, 9) | st.lists(st.integers(-1, 9), max_size=3) | st.booleans() | st.none(),
    max_size=8))  # fmt: skip
def test_sparse_attention_sections_only_raise_config_error(sparse):
    try:
        load_config({"train_batch_size": 1, "sparse_attention": sparse})
    except ConfigError as error:
        assert all(p.path.startswith("sparse_attention") for p in error.problems), str(error)
