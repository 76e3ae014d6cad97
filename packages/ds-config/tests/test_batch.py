"""Batch-size derivation: the seven cases and the assertion order of docs/design.md §1."""

import pytest
from ds_config import BatchSizes, ConfigError, derive_batch_sizes, load_config

# (given TBS, MBS, GAS, world size) -> (TBS, MBS, GAS); the spec's verified examples first (W = 1).
DERIVED = [
    pytest.param((32, None, None, 1), (32, 32, 1), id="spec-only-tbs"),
    pytest.param((None, 4, None, 1), (4, 4, 1), id="spec-only-mbs"),
    pytest.param((32, 4, None, 1), (32, 4, 8), id="spec-tbs-mbs"),
    pytest.param((32, None, 4, 1), (32, 8, 4), id="spec-tbs-gas"),
    pytest.param((None, 4, 3, 1), (12, 4, 3), id="spec-mbs-gas"),
    pytest.param((32, 4, 4, 2), (32, 4, 4), id="case1-all-three"),
    pytest.param((64, 4, None, 4), (64, 4, 4), id="case2-tbs-mbs-w4"),
    pytest.param((64, None, 2, 4), (64, 8, 2), id="case3-tbs-gas-w4"),
    pytest.param((None, 2, 3, 4), (24, 2, 3), id="case4-mbs-gas-w4"),
    pytest.param((32, None, None, 4), (32, 8, 1), id="case5-only-tbs-w4"),
    pytest.param((None, 3, None, 8), (24, 3, 1), id="case6-only-mbs-w8"),
]


@pytest.mark.parametrize(("given", "expected"), DERIVED)
def test_derivation_cases(given, expected):
    tbs, mbs, gas, w = given
    got = derive_batch_sizes(tbs, mbs, gas, w)
    assert (
        got.train_batch_size,
        got.train_micro_batch_size_per_gpu,
        got.gradient_accumulation_steps,
    ) == expected
    assert got.world_size == w


# (given TBS, MBS, GAS, world size) -> (failing key, exact DeepSpeed fragment)
FAILING = [
    pytest.param((10, 3, None, 1), ("train_batch_size", "10 != 3 * 3 * 1"), id="spec-10-3"),
    pytest.param((8, None, 3, 1), ("train_batch_size", "8 != 2 * 3 * 1"), id="spec-8-gas3"),
    pytest.param(
        (None, 0, None, 1),
        ("train_batch_size", "Train batch size: 0 has to be greater than 0"),
        id="spec-mbs0",
    ),
    pytest.param(
        (8, 16, None, 1),
        (
            "train_batch_size",
            "train_batch_size 8 is smaller than train_micro_batch_size_per_gpu * world_size = 16 * 1",
        ),
        id="spec-8-16",
    ),
    pytest.param(
        (8, None, 3, 4),
        (
            "train_batch_size",
            "train_batch_size 8 is smaller than gradient_accumulation_steps * world_size = 3 * 4",
        ),
        id="tbs-below-gas-times-world",
    ),
    pytest.param((32, 4, 4, 1), ("train_batch_size", "32 != 4 * 4 * 1"), id="spec-all-three-inconsistent"),
    pytest.param(
        (8, 0, 2, 1), ("train_micro_batch_size_per_gpu", "Micro batch size per gpu: 0"), id="mbs0-order"
    ),
    pytest.param((None, None, 4, 1), ("train_batch_size", "either train_batch_size or"), id="case7-only-gas"),
    pytest.param((None, None, None, 1), ("train_batch_size", "either train_batch_size or"), id="case7-none"),
    pytest.param((30, 4, None, 4), ("train_batch_size", "30 != 4 * 1 * 4"), id="not-divisible-w4"),
]


@pytest.mark.parametrize(("given", "expected"), FAILING)
def test_assertion_order_and_messages(given, expected):
    tbs, mbs, gas, w = given
    with pytest.raises(ConfigError) as info:
        derive_batch_sizes(tbs, mbs, gas, w)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].path == expected[0]
    assert expected[1] in str(info.value)


def test_error_names_world_size_source_and_proposes_consistent_triple():
    with pytest.raises(ConfigError) as info:
        load_config({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1},
                    world_size=2, world_size_source="MPI environment")  # fmt: skip
    text = str(info.value)
    assert "32 != 4 * 1 * 2" in text
    assert "MPI environment" in text
    # keeps the global and micro batch, fixes the accumulation steps
    assert (
        '"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4'
        in text
    )
    assert "world size of 8" in text  # the config was written for 8 ranks


def test_proposed_triple_is_consistent():
    with pytest.raises(ConfigError) as info:
        derive_batch_sizes(10, 3, None, 1)
    assert (
        '"train_batch_size": 9, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 3'
        in str(info.value)
    )


@pytest.mark.parametrize(
    ("kwargs", "source"),
    [
        ({}, "default 1"),
        ({"world_size": 4}, "explicit argument"),
        ({"world_size": 4, "world_size_source": "torch.distributed"}, "torch.distributed"),
    ],
)
def test_world_size_source_recorded(kwargs, source):
    cfg = load_config({"train_micro_batch_size_per_gpu": 2}, **kwargs)
    assert isinstance(cfg.batch, BatchSizes)
    assert source in cfg.batch.world_size_source
    assert cfg.train_batch_size == 2 * kwargs.get("world_size", 1)
    assert cfg.gradient_accumulation_steps == 1


def test_load_config_fills_all_three_fields():
    cfg = load_config({"train_batch_size": 64, "gradient_accumulation_steps": 2}, world_size=4)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (
        64,
        8,
        2,
    )
    assert "train_micro_batch_size_per_gpu" not in cfg.model_fields_set  # derived, not given


@pytest.mark.parametrize("world_size", [0, -1, True, 2.0])
def test_bad_world_size(world_size):
    with pytest.raises(ConfigError, match="world_size"):
        derive_batch_sizes(8, None, None, world_size)


def test_zero_in_config_fails_as_a_bound():
    # The models bound the batch keys to >= 1, so the config names the key directly.
    with pytest.raises(ConfigError) as info:
        load_config({"train_micro_batch_size_per_gpu": 0})
    assert info.value.paths == ["train_micro_batch_size_per_gpu"]


def test_a_batch_smaller_than_one_micro_batch_quotes_the_users_numbers():
    with pytest.raises(ConfigError) as info:
        load_config({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 16})
    text = str(info.value)
    assert (
        "train_batch_size 8 is smaller than train_micro_batch_size_per_gpu * world_size = 16 * 1 = 16" in text
    )
    assert "gradient_accumulation_steps = 0" not in text and ": 0 has to be" not in text  # never written
    assert (
        '"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1 '
        "(= 8 * 1 * 1)" in text
    )
    assert (
        '"train_batch_size": 16, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1'
        in text
    )


def _proposed(text: str) -> list[tuple[int, int, int]]:
    import re

    pattern = r'"train_batch_size": (\d+), "train_micro_batch_size_per_gpu": (\d+), "gradient_accumulation_steps": (\d+)'
    return [tuple(int(v) for v in m) for m in re.findall(pattern, text)]


def test_proposal_keeps_the_users_accumulation_steps():
    # tbs and gas given, the micro batch derived as 2: 8 != 2 * 3 * 1. No triple keeps both; the first
    # proposal keeps the user's gradient_accumulation_steps (3), not the derived micro batch.
    with pytest.raises(ConfigError) as info:
        derive_batch_sizes(8, None, 3, 1)
    assert _proposed(str(info.value))[0] == (9, 3, 3)


@pytest.mark.parametrize("tbs", [6, 8, 10, 12, 30, 32, 33])
@pytest.mark.parametrize("mbs", [None, 1, 3, 4])
@pytest.mark.parametrize("gas", [None, 1, 2, 3])
@pytest.mark.parametrize("w", [1, 2, 4])
def test_every_proposal_is_consistent_and_keeps_as_many_given_values_as_possible(tbs, mbs, gas, w):
    try:
        derive_batch_sizes(tbs, mbs, gas, w)
    except ConfigError as error:
        text = str(error)
    else:
        return
    triples = _proposed(text)
    assert triples, text
    given = (tbs, mbs, gas)
    # the most given values any consistent triple keeps (brute force over a box around the values)
    box = [(m * g * w, m, g) for m in range(1, 40) for g in range(1, 40)]
    best = max(sum(v is not None and v == t for v, t in zip(given, triple)) for triple in box)
    for t, m, g in triples:
        assert t == m * g * w, text
        assert sum(v is not None and v == x for v, x in zip(given, (t, m, g))) == best, text
