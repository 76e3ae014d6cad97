"""SparseSelfAttention against dense attention restricted to the layout: forward and gradients."""

from __future__ import annotations

import pytest
import torch
from _dense import dense_reference
from ds_sparse_attn import (
    BertSparseSelfAttention,
    BigBirdSparsityConfig,
    BSLongformerSparsityConfig,
    DenseSparsityConfig,
    FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig,
    SparseSelfAttention,
    VariableSparsityConfig,
    _grouped_attention,
    _torch_attention,
)
from ds_sparse_attn._plan import BlockSparsePlan

BLOCK = 4
HEADS = 3

CONFIGS = {
    "dense": lambda a: DenseSparsityConfig(HEADS, BLOCK),
    "fixed": lambda a: FixedSparsityConfig(HEADS, BLOCK, num_local_blocks=2, attention=a),
    "fixed-patterns": lambda a: FixedSparsityConfig(
        HEADS,
        BLOCK,
        True,
        num_local_blocks=4,
        num_global_blocks=1,
        attention=a,
        num_different_global_patterns=3,
    ),
    "fixed-horizontal": lambda a: FixedSparsityConfig(
        HEADS, BLOCK, num_local_blocks=3, horizontal_global_attention=a == "bidirectional", attention=a
    ),
    "variable": lambda a: VariableSparsityConfig(
        HEADS,
        BLOCK,
        True,
        num_random_blocks=1,
        local_window_blocks=[1, 3],
        global_block_indices=[2],
        attention=a,
    ),
    "bigbird": lambda a: BigBirdSparsityConfig(HEADS, BLOCK, True, num_random_blocks=1, attention=a),
    "bslongformer": lambda a: BSLongformerSparsityConfig(
        HEADS, BLOCK, global_block_indices=[1, 5], attention=a
    ),
    "local": lambda a: LocalSlidingWindowSparsityConfig(HEADS, BLOCK, attention=a),
}


def inputs(
    batch: int = 2, seq_len: int = 32, dim: int = 8, dtype: torch.dtype = torch.float32, seed: int = 0
):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, HEADS, seq_len, dim, generator=g, dtype=dtype).requires_grad_() for _ in range(3)
    ]


def grads(out: torch.Tensor, tensors: list[torch.Tensor], seed: int = 1) -> list[torch.Tensor]:
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return list(torch.autograd.grad((out * weight).sum(), tensors))


def assert_matches_dense(module: SparseSelfAttention, tensors, atol: float = 1e-5, **dense_kwargs) -> None:
    rpe = dense_kwargs.get("rpe")
    sparse_out = module(*tensors, **{k: v for k, v in dense_kwargs.items() if not k.startswith("_")})
    kp = dense_kwargs.get("_kp_additive")
    am = dense_kwargs.get("_am_additive")
    dense_out = dense_reference(*tensors, module.master_layout, module.sparsity_config.block, rpe, kp, am)
    torch.testing.assert_close(sparse_out, dense_out, atol=atol, rtol=1e-5)
    leaves = list(tensors) + ([rpe] if rpe is not None and rpe.requires_grad else [])
    for sparse_grad, dense_grad in zip(grads(sparse_out, leaves), grads(dense_out, leaves)):
        torch.testing.assert_close(sparse_grad, dense_grad, atol=atol, rtol=1e-5)


@pytest.fixture
def grouped_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of the grouped flash path, so a test knows which CPU path computed its result."""
    calls: list[int] = []
    apply = _grouped_attention.GroupedFlashAttentionFunction.apply

    def counting_apply(*args):
        calls.append(1)
        return apply(*args)

    monkeypatch.setattr(_grouped_attention.GroupedFlashAttentionFunction, "apply", counting_apply)
    return calls


@pytest.mark.parametrize("backend", ["torch", "torch-gather"])
@pytest.mark.parametrize("attention", ["bidirectional", "unidirectional"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_layout_matches_dense(
    name: str, attention: str, backend: str, grouped_calls: list[int]
) -> None:
    module = SparseSelfAttention(CONFIGS[name](attention), max_seq_length=32, backend=backend)
    assert_matches_dense(module, inputs())
    assert len(grouped_calls) == (backend == "torch")


@pytest.mark.parametrize("name", ["fixed", "bigbird", "local"])
def test_groups_cover_the_layout_exactly(name: str) -> None:
    layout = CONFIGS[name]("bidirectional").make_layout(64)
    plan = BlockSparsePlan(layout, BLOCK, torch.device("cpu"))
    nb = layout.shape[1]
    rebuilt = torch.zeros(HEADS * nb, nb, dtype=torch.bool)
    seen = torch.zeros(HEADS * nb, dtype=torch.int64)
    for group in plan.groups:
        for rows, cols in zip(group.rows, group.cols):
            seen[rows] += 1
            rebuilt[rows[:, None], cols] = True
            assert bool((rows // nb == rows[0] // nb).all())  # one head per group
    assert torch.equal(rebuilt, layout.bool().reshape(-1, nb))
    assert int(seen.max()) == 1  # every row in at most one group (rows attending nothing in none)
    split = plan.common_split
    if split is not None:  # the common columns plus the rest groups are the layout too, without overlap
        common, rest = split
        rebuilt = torch.zeros(HEADS, nb, nb, dtype=torch.int64)
        rebuilt[torch.arange(HEADS)[:, None], :, common] += 1
        rebuilt = rebuilt.reshape(-1, nb)
        for group in rest:
            for rows, cols in zip(group.rows, group.cols):
                rebuilt[rows[:, None], cols] += 1
        assert torch.equal(rebuilt, layout.reshape(-1, nb).long())


def test_fixed_layout_groups_whole_windows() -> None:
    config = FixedSparsityConfig(HEADS, BLOCK, num_local_blocks=4, num_global_blocks=1)
    plan = BlockSparsePlan(config.make_layout(64), BLOCK, torch.device("cpu"))
    # 16 blocks: 4 windows of 4 rows per head, each attending its window plus 3 other windows' global block
    assert [(tuple(g.rows.shape), g.width) for g in plan.groups] == [((HEADS * 4, 4), 7)]
    common, rest = plan.common_split  # every row attends every window's global (last) block
    assert common.tolist() == [[3, 7, 11, 15]] * HEADS
    assert [(tuple(g.rows.shape), g.width) for g in rest] == [((HEADS * 4, 4), 3)]
    # rows in order and each window's three local blocks consecutive: the CPU path reads them as views
    assert torch.equal(rest[0].rows, torch.arange(HEADS * 16).view(-1, 4))
    assert _grouped_attention._run(rest[0].keys) == (0, 4, 1)
    unidirectional = FixedSparsityConfig(HEADS, BLOCK, num_local_blocks=4, attention="unidirectional")
    assert BlockSparsePlan(unidirectional.make_layout(64), BLOCK, torch.device("cpu")).common_split is None


@pytest.mark.parametrize(
    ("index", "is_view"),
    [
        ([[0, 1, 2], [4, 5, 6], [8, 9, 10]], True),  # windows: distinct blocks
        ([[0, 1, 2], [1, 2, 3], [2, 3, 4]], True),  # sliding window: overlapping blocks
        ([[3, 7], [19, 23]], False),  # global columns per head: block step 4, distinct
        ([[0, 2], [1, 3]], False),  # interleaved groups: a run, but not of distinct blocks
        ([[5], [2], [7]], False),  # no run
    ],
)
def test_block_views_match_index_select_and_index_add(index: list[list[int]], is_view: bool) -> None:
    block, dim = 2, 3
    index = torch.tensor(index)
    x = torch.randn(2, 24, block * dim)
    expected = x.index_select(1, index.reshape(-1)).view(2, index.shape[0], -1, dim)
    got = _grouped_attention._gather(x, index, block)
    assert torch.equal(got, expected)
    assert (got.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()) == is_view
    # strided like the kernel's gradients: (B, L, G, D) memory order
    src = torch.randn(2, index.shape[1] * block, index.shape[0], dim).transpose(1, 2)
    dst = torch.randn(2, 24, block * dim)
    expected = dst.clone().index_add_(1, index.reshape(-1), src.reshape(2, -1, block * dim))
    _grouped_attention._add_blocks(dst, index, src, block)
    torch.testing.assert_close(dst, expected)


def test_dense_layout_is_all_common() -> None:
    plan = BlockSparsePlan(DenseSparsityConfig(HEADS, BLOCK).make_layout(32), BLOCK, torch.device("cpu"))
    common, rest = plan.common_split
    assert common.shape == (HEADS, 8) and rest == []


@pytest.mark.parametrize("with_rpe", [False, True])
@pytest.mark.parametrize("kp_mode", ["add", "mul"])
@pytest.mark.parametrize("am_mode", ["add", "mul"])
def test_grouped_path_with_masks_and_constant_rpe(
    kp_mode: str, am_mode: str, with_rpe: bool, grouped_calls: list[int]
) -> None:
    config = BigBirdSparsityConfig(HEADS, BLOCK, True, num_random_blocks=1)
    module = SparseSelfAttention(
        config, key_padding_mask_mode=kp_mode, attn_mask_mode=am_mode, max_seq_length=32
    )
    g = torch.Generator().manual_seed(7)
    seq_len = 32
    kp = (torch.rand(2, seq_len, generator=g) > 0.3).float()
    kp[:, 0] = 1
    kp_additive = torch.zeros_like(kp).masked_fill(kp == 0, float("-inf")) if kp_mode == "mul" else kp
    am = (torch.rand(seq_len, seq_len, generator=g) > 0.3).float()
    am[:, 0] = 1
    am_additive = torch.zeros_like(am).masked_fill(am == 0, float("-inf")) if am_mode == "mul" else am
    kwargs = {
        "key_padding_mask": kp,
        "attn_mask": am,
        "_kp_additive": kp_additive,
        "_am_additive": am_additive,
    }
    if with_rpe:  # a constant rpe (no gradient wanted) goes into the kernel's mask too
        kwargs["rpe"] = torch.randn(HEADS, seq_len, seq_len, generator=g)
    assert_matches_dense(module, inputs(), **kwargs)
    assert len(grouped_calls) == 1


def test_grouped_path_key_padding_alone_in_chunks(
    monkeypatch: pytest.MonkeyPatch, grouped_calls: list[int]
) -> None:
    monkeypatch.setattr(_grouped_attention, "_CHUNK_KV_ELEMS", 100)  # one group per kernel call
    config = BigBirdSparsityConfig(HEADS, BLOCK, True, num_random_blocks=1, num_global_blocks=2)
    module = SparseSelfAttention(config, max_seq_length=64)
    kp = torch.randn(2, 64, generator=torch.Generator().manual_seed(2))
    assert_matches_dense(module, inputs(seq_len=64), key_padding_mask=kp, _kp_additive=kp)
    assert len(grouped_calls) == 1


def test_grouped_path_gradcheck_float64(grouped_calls: list[int]) -> None:
    config = VariableSparsityConfig(2, 2, True, num_random_blocks=1, local_window_blocks=[2])
    module = SparseSelfAttention(config, max_seq_length=8)
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 2, 8, 3, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3)
    )
    assert torch.autograd.gradcheck(module, (q, k, v))
    assert grouped_calls


@pytest.mark.parametrize("attention", ["bidirectional", "unidirectional"])
@pytest.mark.parametrize("kp_mode", ["add", "mul"])
@pytest.mark.parametrize("am_mode", ["add", "mul"])
def test_masks_and_rpe_match_dense(
    attention: str, kp_mode: str, am_mode: str, grouped_calls: list[int]
) -> None:
    config = BigBirdSparsityConfig(HEADS, BLOCK, True, num_random_blocks=1, attention=attention)
    module = SparseSelfAttention(
        config, key_padding_mask_mode=kp_mode, attn_mask_mode=am_mode, max_seq_length=64
    )
    g = torch.Generator().manual_seed(5)
    seq_len = 32
    rpe = torch.randn(HEADS, seq_len, seq_len, generator=g).requires_grad_()
    if kp_mode == "mul":
        kp = (torch.rand(2, seq_len, generator=g) > 0.3).float()
        kp[:, 0] = 1  # every row keeps at least its global key
        kp_additive = torch.zeros_like(kp).masked_fill(kp == 0, float("-inf"))
    else:
        kp = torch.randn(2, 1, 1, seq_len, generator=g)  # BERT's extended mask shape, squeezed to (B, L)
        kp_additive = kp.view(2, seq_len)
    if am_mode == "mul":
        am = (torch.rand(seq_len, seq_len, generator=g) > 0.3).int()
        am[:, 0] = 1
        am_additive = torch.zeros(seq_len, seq_len).masked_fill(am == 0, float("-inf"))
    else:
        am = torch.randn(1, seq_len, seq_len, generator=g)
        am_additive = am.view(seq_len, seq_len)
    assert_matches_dense(
        module,
        inputs(),
        rpe=rpe,
        key_padding_mask=kp,
        attn_mask=am,
        _kp_additive=kp_additive,
        _am_additive=am_additive,
    )
    assert not grouped_calls  # an rpe that needs a gradient takes the gathered-matmul path


@pytest.mark.parametrize("shape", [(32, 32), (1, 1, 32, 32), (2, HEADS, 32, 32)])
def test_rpe_shapes(shape: tuple[int, ...]) -> None:
    module = SparseSelfAttention(FixedSparsityConfig(HEADS, BLOCK, num_local_blocks=2), max_seq_length=32)
    rpe = torch.randn(shape, generator=torch.Generator().manual_seed(3)).requires_grad_()
    assert_matches_dense(module, inputs(), rpe=rpe)


def test_many_chunks_and_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    # tiny chunks: every bucket is processed in several pieces; BigBird global rows form their own bucket
    monkeypatch.setattr(_torch_attention, "_CHUNK_SCORE_ELEMS", 1000)
    config = BigBirdSparsityConfig(HEADS, BLOCK, True, num_random_blocks=1, num_global_blocks=2)
    module = SparseSelfAttention(config, max_seq_length=64)
    plan = module._plan(64, HEADS, torch.device("cpu"))
    assert len(plan.buckets) >= 2
    assert_matches_dense(module, inputs(seq_len=64), rpe=torch.randn(64, 64).requires_grad_())


def test_gradcheck_float64() -> None:
    config = VariableSparsityConfig(2, 2, True, num_random_blocks=1, local_window_blocks=[2])
    module = SparseSelfAttention(config, max_seq_length=8)
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 2, 8, 3, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3)
    )
    rpe = torch.randn(8, 8, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v, r: module(q, k, v, rpe=r), (q, k, v, rpe))


def test_fully_masked_row_gives_zeros_not_nan() -> None:
    module = SparseSelfAttention(
        LocalSlidingWindowSparsityConfig(1, BLOCK), key_padding_mask_mode="mul", max_seq_length=16
    )
    q, k, v = (torch.randn(1, 1, 16, 4, requires_grad=True) for _ in range(3))
    kp = torch.ones(1, 16)
    kp[0, :4] = 0  # query block 0 sees only key block 0, now fully masked
    out = module(q, k, v, key_padding_mask=kp)
    assert torch.equal(out[0, 0, :4], torch.zeros(4, 4))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_cpu(dtype: torch.dtype) -> None:
    module = SparseSelfAttention(FixedSparsityConfig(HEADS, BLOCK, num_local_blocks=2), max_seq_length=16)
    tensors = inputs(batch=1, seq_len=16, dim=4, dtype=dtype)
    out = module(*tensors)
    assert out.dtype == dtype
    reference = dense_reference(*(t.detach().float() for t in tensors), module.master_layout, BLOCK)
    torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=2e-2)
    out.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == dtype for t in tensors)


def test_default_module_works_with_any_head_count() -> None:
    module = SparseSelfAttention()
    assert module.master_layout.shape == (4, 128, 128)
    q, k, v = (torch.randn(1, 6, 64, 8) for _ in range(3))
    out = module(q, k, v)
    dense = dense_reference(q, k, v, module.master_layout[:1].expand(6, -1, -1), 16)
    torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)


def test_key_given_transposed() -> None:
    module = SparseSelfAttention(FixedSparsityConfig(HEADS, BLOCK), max_seq_length=32)
    q, k, v = (t.detach() for t in inputs())
    torch.testing.assert_close(module(q, k.transpose(-1, -2), v), module(q, k, v))


def test_input_errors() -> None:
    module = SparseSelfAttention(FixedSparsityConfig(HEADS, BLOCK), max_seq_length=32)
    q = torch.randn(1, HEADS, 30, 8)
    with pytest.raises(
        ValueError, match="Sequence Length, 30, needs to be dividable by Block size 4!.*pad_to_block_size"
    ):
        module(q, q, q)
    q = torch.randn(1, HEADS, 16, 8)
    with pytest.raises(NotImplementedError, match="only self-attention"):
        module(q, q, torch.randn(1, HEADS, 16, 4))
    long = torch.randn(1, HEADS, 64, 8)
    with pytest.raises(ValueError, match="max_seq_length"):
        module(long, long, long)
    with pytest.raises(ValueError, match="attn_mask must be a 2-D"):
        module(q, q, q, attn_mask=torch.ones(2, 16, 16))
    with pytest.raises(ValueError, match="key_padding_mask"):
        module(q, q, q, key_padding_mask=torch.ones(1, 15))
    with pytest.raises(ValueError, match="key_padding_mask_mode"):
        SparseSelfAttention(key_padding_mask_mode="multiply")
    per_head = SparseSelfAttention(FixedSparsityConfig(2, BLOCK, True), max_seq_length=32)
    with pytest.raises(ValueError, match="num_heads=3"):
        per_head(q, q, q)


def test_numba_backend_without_gpu_is_refused() -> None:
    module = SparseSelfAttention(FixedSparsityConfig(HEADS, BLOCK), max_seq_length=16, backend="numba")
    q = torch.randn(1, HEADS, 16, 8)
    with pytest.raises((RuntimeError, ImportError), match="numba|CUDA"):
        module(q, q, q)


def test_bert_sparse_self_attention() -> None:
    config = type("Cfg", (), {"hidden_size": 12, "num_attention_heads": 3, "max_position_embeddings": 64})()
    layer = BertSparseSelfAttention(config, FixedSparsityConfig(3, BLOCK, num_local_blocks=2))
    hidden = torch.randn(2, 16, 12)
    mask = torch.zeros(2, 1, 1, 16)
    mask[1, ..., 12:] = -10000.0
    out = layer(hidden, mask)
    assert out.shape == (2, 16, 12)
    q, k, v = (layer.transpose_for_scores(proj(hidden)) for proj in (layer.query, layer.key, layer.value))
    dense = dense_reference(
        q, k, v, layer.sparse_self_attention.master_layout, BLOCK, key_padding=mask.view(2, 16)
    )
    torch.testing.assert_close(out, dense.permute(0, 2, 1, 3).reshape(2, 16, 12), atol=1e-5, rtol=1e-5)
    bad = type("Cfg", (), {"hidden_size": 10, "num_attention_heads": 3})()
    with pytest.raises(
        ValueError, match=r"The hidden size \(10\) is not a multiple of the number of attention heads \(3\)"
    ):
        BertSparseSelfAttention(bad)
