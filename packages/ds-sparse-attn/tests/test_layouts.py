"""Layouts against the rules and examples of DeepSpeed 0.14 (docs/design.md §8)."""

from __future__ import annotations

import types

import pytest
import torch
from ds_sparse_attn import (
    BigBirdSparsityConfig,
    BSLongformerSparsityConfig,
    DenseSparsityConfig,
    FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig,
    SparsityConfig,
    VariableSparsityConfig,
    from_config,
    plot_layout,
)
from rank_testing import spawn


def rows(*patterns: str) -> torch.Tensor:
    return torch.tensor([[int(c) for c in p] for p in patterns], dtype=torch.int64)


def make(config: SparsityConfig, num_blocks: int) -> torch.Tensor:
    return config.make_layout(num_blocks * config.block)


def test_dense_is_all_ones() -> None:
    layout = make(DenseSparsityConfig(num_heads=2, block=4), 5)
    assert layout.shape == (2, 5, 5) and layout.dtype == torch.int64 and bool((layout == 1).all())


def test_seq_len_not_multiple_of_block_names_the_fix() -> None:
    with pytest.raises(
        ValueError, match=r"Sequence Length, 70, needs to be dividable by Block size 16!.*pad_to_block_size"
    ):
        FixedSparsityConfig(num_heads=1).make_layout(70)


def test_base_config_has_no_layout() -> None:
    with pytest.raises(NotImplementedError, match="FixedSparsityConfig"):
        SparsityConfig(num_heads=4).make_layout(64)


def test_fixed_bidirectional_example() -> None:
    layout = make(FixedSparsityConfig(num_heads=3, block=2, num_local_blocks=4, num_global_blocks=1), 10)
    expected = rows(*["1111000101"] * 4, *["0001111101"] * 4, *["0001000111"] * 2)
    for h in range(3):
        assert torch.equal(layout[h], expected)


def test_fixed_unidirectional_example() -> None:
    layout = make(FixedSparsityConfig(num_heads=1, block=2, attention="unidirectional"), 10)[0]
    assert torch.equal(layout[0], rows("1000000000")[0])
    assert torch.equal(layout[3], rows("1111000000")[0])
    assert torch.equal(layout[4], rows("0001100000")[0])
    assert torch.equal(layout[7], rows("0001111100")[0])
    assert torch.equal(layout[8], rows("0001000110")[0])
    assert torch.equal(layout[9], rows("0001000111")[0])


def test_fixed_horizontal_global() -> None:
    layout = make(FixedSparsityConfig(num_heads=1, block=2, horizontal_global_attention=True), 8)[0]
    expected = rows(
        "11110001", "11110001", "11110001", "11111111", "00011111", "00011111", "00011111", "11111111"
    )
    assert torch.equal(layout, expected)


def test_fixed_different_global_patterns_per_head() -> None:
    config = FixedSparsityConfig(
        num_heads=5, block=2, different_layout_per_head=True, num_different_global_patterns=4
    )
    layout = make(config, 8)
    # pattern p uses global column L - (1 + p) * G of each window; head 4 wraps around to pattern 0
    for h, column in [(0, 3), (1, 2), (2, 1), (3, 0), (4, 3)]:
        assert bool(layout[h, :, column].all()) and bool(layout[h, :, column + 4].all())
    assert torch.equal(layout[1, 0], rows("11110010")[0])
    assert torch.equal(layout[4], layout[0])
    assert not torch.equal(layout[1], layout[0])


def test_fixed_global_blocks_wider_than_one_and_short_last_window() -> None:
    layout = make(FixedSparsityConfig(num_heads=1, block=2, num_local_blocks=4, num_global_blocks=2), 9)[0]
    # full windows: global columns 2-3 and 6-7; short last window [8, 9): start = min(8 + 2, 9 - 2) = 7, columns 7-8
    assert torch.equal(layout[0], rows("111100111")[0])
    assert torch.equal(layout[8], rows("001100111")[0])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            dict(num_local_blocks=4, num_global_blocks=3),
            ValueError,
            "must be dividable by number of global blocks, 3",
        ),
        (dict(attention="causal"), NotImplementedError, "uni/bi-directional"),
        (dict(attention="unidirectional", horizontal_global_attention=True), ValueError, "horizontal global"),
        (dict(num_different_global_patterns=2), ValueError, "Set different_layout_per_head to True"),
        (
            dict(num_different_global_patterns=5, different_layout_per_head=True),
            ValueError,
            r"\(num_different_global_patterns\), 5, cannot be larger",
        ),
    ],
)
def test_fixed_validation(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        FixedSparsityConfig(num_heads=4, **kwargs)


def test_variable_default_example() -> None:
    layout = make(VariableSparsityConfig(num_heads=1, block=2), 9)[0]
    assert torch.equal(layout, rows(*["111100000"] * 4, *["100011110"] * 4, "100000001"))


def test_variable_windows_globals_and_ranges() -> None:
    config = VariableSparsityConfig(
        num_heads=1,
        block=2,
        local_window_blocks=[1, 2],
        global_block_indices=[3, 20],
        global_block_end_indices=[5, 30],
        attention="unidirectional",
    )
    layout = make(config, 7)[0]
    # windows [0,1), [1,3), then size 2 repeats: [3,5), [5,7); global columns 3-4 from row 3 on, causal
    # as in DeepSpeed, row 3 also sees column 4, a later block of its own global range
    expected = rows("1000000", "0100000", "0110000", "0001100", "0001100", "0001110", "0001111")
    assert torch.equal(layout, expected)


def test_variable_horizontal_global() -> None:
    layout = make(VariableSparsityConfig(num_heads=1, block=2, horizontal_global_attention=True), 6)[0]
    assert bool(layout[0].all()) and bool(layout[:, 0].all())
    assert torch.equal(layout[5], rows("100011")[0])


def test_variable_random_blocks_seeded_and_per_head() -> None:
    config = VariableSparsityConfig(
        num_heads=3,
        block=2,
        num_random_blocks=2,
        local_window_blocks=[1],
        global_block_indices=[],
        different_layout_per_head=True,
    )
    first, second = make(config, 12), make(config, 12)
    assert torch.equal(first, second)  # reruns agree (seeded)
    other = config.make_layout(24, generator=torch.Generator().manual_seed(123))
    assert not torch.equal(first, other)
    # each row: its diagonal local block plus 2 distinct random columns (which may hit the diagonal)
    counts = first.sum(-1)
    assert bool(((counts >= 2) & (counts <= 3)).all())
    assert not torch.equal(first[0], first[1])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(global_block_indices=[0, 4], global_block_end_indices=[2]),
            "start indices length, 2, must be same as global block end indices length, 1",
        ),
        (
            dict(global_block_indices=[3], global_block_end_indices=[3]),
            "start index, 3, must be smaller than global block end index, 3",
        ),
        (dict(local_window_blocks=[]), "local_window_blocks"),
        (dict(attention="unidirectional", horizontal_global_attention=True), "horizontal"),
    ],
)
def test_variable_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VariableSparsityConfig(num_heads=1, **kwargs)


def test_variable_too_many_random_blocks() -> None:
    config = VariableSparsityConfig(num_heads=1, block=2, num_random_blocks=5)
    assert make(config, 5).sum(-1).min() == 5  # equality allowed
    with pytest.raises(
        ValueError,
        match="Number of random blocks, 5, must be smaller than overall number of blocks in a row, 4",
    ):
        make(config, 4)


def test_bigbird_example_without_random() -> None:
    layout = make(BigBirdSparsityConfig(num_heads=1, block=2, num_random_blocks=0), 8)[0]
    assert torch.equal(layout[0], rows("11111111")[0])
    assert torch.equal(layout[1], rows("11100000")[0])
    assert torch.equal(layout[2], rows("11110000")[0])
    assert torch.equal(layout[3], rows("10111000")[0])
    assert torch.equal(layout[7], rows("10000011")[0])


def test_bigbird_random_rows_and_unidirectional() -> None:
    config = BigBirdSparsityConfig(num_heads=2, block=2, num_random_blocks=1, different_layout_per_head=True)
    base = make(BigBirdSparsityConfig(num_heads=2, block=2, num_random_blocks=0), 16)
    layout = make(config, 16)
    assert bool((layout >= base).all()) and bool(((layout - base).sum(-1) <= 1).all())
    uni = make(
        BigBirdSparsityConfig(num_heads=1, block=2, num_random_blocks=1, attention="unidirectional"), 16
    )
    assert torch.equal(uni, torch.tril(uni))
    assert bool(uni[0, :, 0].all())


@pytest.mark.parametrize(
    "kwargs, blocks, message",
    [
        (dict(num_random_blocks=5), 4, "random blocks, 5"),
        (dict(num_random_blocks=0, num_sliding_window_blocks=5), 4, "sliding window blocks, 5"),
        (dict(num_random_blocks=0, num_global_blocks=5), 4, "global blocks, 5"),
        (dict(num_random_blocks=2, attention="unidirectional"), 8, "Unidirectional BigBird"),
    ],
)
def test_bigbird_validation(kwargs: dict, blocks: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(BigBirdSparsityConfig(num_heads=1, block=2, **kwargs), blocks)
    with pytest.raises(NotImplementedError):
        BigBirdSparsityConfig(num_heads=1, attention="sideways")


def test_bslongformer_examples() -> None:
    bigbird = make(BigBirdSparsityConfig(num_heads=1, block=2, num_random_blocks=0), 8)
    assert torch.equal(make(BSLongformerSparsityConfig(num_heads=1, block=2), 8), bigbird)
    uni = make(BSLongformerSparsityConfig(num_heads=1, block=2, attention="unidirectional"), 8)[0]
    assert torch.equal(uni[0], rows("10000000")[0])
    assert torch.equal(uni[2], rows("11100000")[0])
    assert torch.equal(uni[3], rows("10110000")[0])
    assert torch.equal(uni[7], rows("10000011")[0])


def test_bslongformer_global_ranges() -> None:
    config = BSLongformerSparsityConfig(
        num_heads=1,
        block=2,
        num_sliding_window_blocks=1,
        global_block_indices=[2, 9],
        global_block_end_indices=[4, 12],
    )
    layout = make(config, 6)[0]
    assert bool(layout[2:4].all()) and bool(layout[:, 2:4].all())
    assert torch.equal(layout[5], rows("001101")[0])
    with pytest.raises(ValueError, match="start index, 4"):
        BSLongformerSparsityConfig(num_heads=1, global_block_indices=[4], global_block_end_indices=[1])


def test_local_sliding_window() -> None:
    uni = make(LocalSlidingWindowSparsityConfig(num_heads=2, block=2), 6)
    assert torch.equal(uni[1], rows("100000", "110000", "011000", "001100", "000110", "000011"))
    bi = make(LocalSlidingWindowSparsityConfig(num_heads=1, block=2, attention="bidirectional"), 4)[0]
    assert torch.equal(bi, rows("1100", "1110", "0111", "0011"))
    with pytest.raises(ValueError, match="sliding window blocks, 3"):
        make(LocalSlidingWindowSparsityConfig(num_heads=1, block=2), 2)


def test_from_config_every_mode() -> None:
    common = {"block": 8, "different_layout_per_head": True}
    fixed = from_config(_section(mode="fixed", num_different_global_patterns=4, **common), num_heads=4)
    assert (
        isinstance(fixed, FixedSparsityConfig)
        and fixed.num_different_global_patterns == 4
        and fixed.block == 8
    )
    for mode, cls in [
        ("dense", DenseSparsityConfig),
        ("variable", VariableSparsityConfig),
        ("bigbird", BigBirdSparsityConfig),
        ("bslongformer", BSLongformerSparsityConfig),
    ]:
        section = _section(mode=mode, **({"block": 8} if mode == "dense" else common))
        config = from_config(section, num_heads=4)
        assert type(config) is cls and config.num_heads == 4 and config.block == 8
    bigbird = from_config(_section(mode="bigbird"), num_heads=2)
    assert bigbird.num_random_blocks == 0  # the config parser's default, not the class's 1
    with pytest.raises(TypeError, match="sparse_attention section"):
        from_config(types.SimpleNamespace(mode="fixed", block=16), num_heads=2)


def _section(**keys):
    import pydantic
    from ds_config import SparseAttentionConfig

    return pydantic.TypeAdapter(SparseAttentionConfig).validate_python(keys)


def test_from_config_with_ds_config_model() -> None:
    ds_config = pytest.importorskip("ds_config")
    pydantic = pytest.importorskip("pydantic")
    if not hasattr(ds_config, "SparseAttentionConfig"):
        pytest.skip("ds_config.SparseAttentionConfig not written yet")
    adapter = pydantic.TypeAdapter(ds_config.SparseAttentionConfig)
    section = adapter.validate_python({"mode": "variable", "block": 4, "local_window_blocks": [2, 3]})
    config = from_config(section, num_heads=2)
    assert isinstance(config, VariableSparsityConfig) and config.local_window_blocks == [2, 3]
    assert config.make_layout(20).shape == (2, 5, 5)
    bigbird = from_config(
        adapter.validate_python({"mode": "bigbird", "attention": "unidirectional"}), num_heads=2
    )
    assert isinstance(bigbird, BigBirdSparsityConfig) and bigbird.attention == "unidirectional"
    assert bigbird.num_random_blocks == 0
    default = from_config(adapter.validate_python({}), num_heads=2)
    assert isinstance(default, FixedSparsityConfig) and default.block == 16


def test_plot_layout_writes_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "layout.png"
    plot_layout(make(FixedSparsityConfig(num_heads=3, block=2), 8), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _layout_on_rank(rank: int, world_size: int) -> list:
    # Different per-rank seeds: only the broadcast from rank 0 can make the ranks agree.
    config = BigBirdSparsityConfig(num_heads=2, block=2, num_random_blocks=2, seed=100 + rank)
    return config.make_layout(32).tolist()


def test_random_layout_identical_on_every_rank() -> None:
    layouts = spawn(_layout_on_rank, 2)
    assert layouts[0] == layouts[1]
    expected = BigBirdSparsityConfig(num_heads=2, block=2, num_random_blocks=2, seed=100).make_layout(32)
    assert layouts[0] == expected.tolist()
