"""In-process tests: layout, bucket plan, averaging formulas, option checks, from_config."""

from __future__ import annotations

import _workers as w
import pytest
import torch
import torch.distributed as dist
from ds_zero import (
    CONFIG_FIELDS,
    GradientReducer,
    GroupLayout,
    LossScalerProtocol,
    ZeroConfigError,
    ZeroOptimizer,
    ZeroOptions,
)
from ds_zero._comm import AveragingRule, plan_buckets
from rank_testing import live_storage_bytes
from torch import nn


@pytest.fixture
def world_of_one():
    """A real one-process gloo group inside the test process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_layout_pads_at_the_end_into_the_last_partition():
    layout = GroupLayout.build([torch.Size([5, 3]), torch.Size([7])], dp=4)  # 22 elements
    assert layout.padded_numel == 24 and layout.padded_numel % 8 == 0
    assert layout.partition_numel == 6
    assert [layout.shard(r) for r in range(4)] == [(0, 6), (6, 12), (12, 18), (18, 22)]
    # the first parameter [0, 15) straddles ranks 0, 1 and 2
    assert layout.owners(*layout.param_range(0)) == [(0, 0, 6), (1, 6, 12), (2, 12, 15)]
    assert layout.owners(*layout.param_range(1)) == [(2, 15, 18), (3, 18, 22)]


def test_layout_of_an_empty_group_is_all_padding():
    layout = GroupLayout.build([], dp=3)
    assert layout.numel == 0 and layout.padded_numel == 6
    assert [layout.shard(r) for r in range(3)] == [(0, 0)] * 3


def test_bucket_plan_bounds_elements_and_isolates_large_items():
    assert plan_buckets([3, 3, 3, 10, 1, 1], 6) == [[0, 1], [2], [3], [4, 5]]
    assert plan_buckets([], 6) == []
    with pytest.raises(ValueError, match="at least 1"):
        plan_buckets([1], 0)


def test_averaging_rule_postscale_and_prescale():
    post = AveragingRule(dp=4, prescale=False, predivide=2.0)
    t = torch.full((3,), 8.0)
    post.before(t)
    assert t.tolist() == [4.0] * 3  # 1/predivide
    assert post.after_factor() == 0.5  # predivide / dp
    assert AveragingRule(dp=4, predivide=4.0).after_factor() == 1.0  # skipped when predivide == dp
    pre = AveragingRule(dp=4, prescale=True, predivide=2.0)  # predivide ignored with prescale
    t = torch.full((3,), 8.0)
    pre.before(t)
    assert t.tolist() == [2.0] * 3 and pre.after_factor() == 1.0


def test_test_scaler_satisfies_the_protocol():
    assert isinstance(w.HalvingScaler(), LossScalerProtocol)
    assert not isinstance(object(), LossScalerProtocol)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stage": 3}, "stages 1 and 2"),
        ({"stage": 0}, "GradientReducer"),
        ({"stage": 1, "fp32_allreduce": True}, "fp32_allreduce"),
        ({"stage": 2, "gradient_predivide_factor": 2.0}, "gradient_predivide_factor != 1.0"),
        ({"stage": 2, "prescale_gradients": True}, "pre-scale gradients"),
        ({"stage": 1, "reduce_bucket_size": 0}, "reduce_bucket_size"),
        ({"stage": 1, "clip_grad": -1.0}, "gradient_clipping"),
    ],
)
def test_rejected_options_say_what_to_change(kwargs, message):
    opt = torch.optim.Adam(nn.Linear(2, 2).parameters())
    with pytest.raises(ZeroConfigError, match=message):
        ZeroOptimizer(opt, ZeroOptions(**kwargs))


def test_untested_optimizer_needs_the_flag(world_of_one):
    model = nn.Linear(2, 2)
    with pytest.raises(ZeroConfigError, match="zero_allow_untested_optimizer"):
        ZeroOptimizer(torch.optim.Rprop(model.parameters()), ZeroOptions(stage=1))
    zero = ZeroOptimizer(
        torch.optim.Rprop(model.parameters()), ZeroOptions(stage=1, allow_untested_optimizer=True)
    )
    assert zero.optimizer.param_groups[0]["params"][0].numel() == 6


def test_from_config_maps_the_real_config_section(world_of_one):
    ds_config = pytest.importorskip("ds_config")
    cfg = ds_config.load_config(
        {
            "train_batch_size": 2,
            "zero_optimization": {
                "stage": 2,
                "reduce_bucket_size": 5,
                "allgather_bucket_size": 77,
                "overlap_comm": True,
                "reduce_scatter": False,
                "allgather_partitions": False,
                "offload_optimizer": {"device": "cpu", "pin_memory": True},
                "ignore_unused_parameters": False,
            },
            "gradient_clipping": 1.0,
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": True, "grad_accum_dtype": "fp32"},
        },
        world_size=1,
    )
    model = nn.Linear(3, 3).to(torch.bfloat16)
    with pytest.warns(UserWarning, match="pin_memory has no effect"):  # this torch has no CUDA
        zero = ZeroOptimizer.from_config(torch.optim.Adam(model.parameters()), cfg)
    o = zero.options
    assert (o.stage, o.reduce_bucket_size, o.allgather_bucket_size) == (2, 5, 77)
    assert o.overlap_comm and not o.reduce_scatter and not o.allgather_partitions
    assert o.cpu_offload and o.pin_memory and not o.ignore_unused_parameters
    assert o.clip_grad == 1.0 and o.allow_untested_optimizer and o.grad_accum_dtype == torch.float32
    assert zero._reducer.contiguous  # offload forces contiguous gradients
    reducer = GradientReducer.from_config(nn.Linear(3, 3), cfg)
    assert reducer.bucket_sizes == [3, 9] and reducer.overlap_comm


def test_memory_report_of_a_single_rank(world_of_one):
    model = nn.Linear(10, 10)  # 110 elements, padded to 110 (divisible by 2)
    zero = ZeroOptimizer(torch.optim.Adam(model.parameters()), ZeroOptions(stage=2, reduce_bucket_size=50))
    zero.backward(model(torch.randn(3, 10)).sum())
    assert zero.step()
    rep = zero.memory_report()
    # the fp32 master is a view of the fp32 weights, so it adds no bytes; no gradient survives the step
    assert rep.param_bytes == 110 * 4 and rep.master_param_bytes == 0 and rep.grad_bytes == 0
    assert rep.optimizer_state_bytes == 2 * 110 * 4 + 4  # exp_avg, exp_avg_sq and the step counter
    assert (
        rep.total_bytes
        == rep.param_bytes + rep.master_param_bytes + rep.grad_bytes + rep.optimizer_state_bytes
    )


def test_config_fields_name_real_config_paths():
    ds_config = pytest.importorskip("ds_config")
    unknown = set(CONFIG_FIELDS) - set(ds_config.leaf_paths())
    assert not unknown, f"not DSConfig leaves: {sorted(unknown)}"


def test_params_become_views_of_the_flat_buffer(world_of_one):
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    before = [p.detach().clone() for p in model.parameters()]
    zero = ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), ZeroOptions(stage=1))
    flat = zero.groups[0].flat
    for p, old in zip(model.parameters(), before):
        assert p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
        assert torch.equal(p, old)


@pytest.mark.parametrize(
    "stage, offload, contiguous",
    [(1, False, False), (1, False, True), (1, True, False), (2, False, False), (2, True, False)],
)
def test_after_a_step_an_fp32_rank_holds_weights_and_adam_moments_only(
    world_of_one, stage, offload, contiguous
):
    """Issue 18: no fp32 master copy of fp32 weights, no gradient partition kept between steps. With
    offload the weights already live in CPU memory, so the master stays a view of them too, and the
    staging buffers that offload's contiguous gradients use are freed when the backward's reductions
    are done. Stage 1's flat gradient buffer (contiguous_gradients, offload) lives from a window's first
    backward to its step, and autograd accumulates straight into it."""
    before = live_storage_bytes()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8))
    param_bytes = sum(p.numel() for p in model.parameters()) * 4
    zero = ZeroOptimizer(
        torch.optim.Adam(model.parameters()),
        ZeroOptions(
            stage=stage, reduce_bucket_size=20_000, cpu_offload=offload, contiguous_gradients=contiguous
        ),
    )
    x = torch.randn(4, 256)
    for _ in range(2):  # two windows: the buffer is made again for the second
        zero.backward(model(x).square().mean())
        if stage == 1 and (offload or contiguous):
            flat_grad = zero.groups[0].flat_grad
            assert all(
                p.grad.untyped_storage().data_ptr() == flat_grad.untyped_storage().data_ptr()
                for p in model.parameters()
            )
            del flat_grad
        assert zero.step()
        zero.zero_grad()
    del x
    live = live_storage_bytes() - before
    # weights (one flat buffer) + exp_avg + exp_avg_sq (dp = 1: the whole partition) + a few scalars
    assert live <= 3 * param_bytes + 1024, (live, param_bytes)
    assert live >= 3 * param_bytes, (live, param_bytes)
    assert zero.groups[0].master.device.type == "cpu" and not zero.staging_buffers()
    zero.remove_hooks()


def test_sparse_gradients_at_zero_stages_say_why_and_what_to_change(world_of_one):
    ds_config = pytest.importorskip("ds_config")
    for stage in (1, 2):
        cfg = ds_config.load_config(
            {"train_batch_size": 2, "sparse_gradients": True, "zero_optimization": {"stage": stage}},
            world_size=1,
        )
        with pytest.raises(
            ZeroConfigError, match="sparse_gradients is not supported.*Set sparse_gradients to false"
        ):
            ZeroOptimizer.from_config(torch.optim.Adam(nn.Linear(2, 2).parameters()), cfg)


def test_offload_with_cpu_adam_writes_the_bf16_weights_once(world_of_one):
    """CPUAdam writes the model-dtype weights during its update; ZeRO must not copy the master again."""
    ds_optim = pytest.importorskip("ds_optim")
    from torch.utils._python_dispatch import TorchDispatchMode

    model = nn.Linear(16, 16).to(torch.bfloat16)
    opt = ds_optim.CPUAdam(model.parameters(), lr=0.1)
    zero = ZeroOptimizer(opt, ZeroOptions(stage=2, cpu_offload=True))
    flat = zero.groups[0].flat

    class CopiesIntoWeights(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is torch.ops.aten.copy_ and args[0].untyped_storage().data_ptr() == (
                flat.untyped_storage().data_ptr()
            ):
                CopiesIntoWeights.count += 1
            return func(*args, **(kwargs or {}))

    zero.backward(model(torch.randn(2, 16, dtype=torch.bfloat16)).float().square().mean())
    with CopiesIntoWeights():
        assert zero.step()
    assert CopiesIntoWeights.count == 0
    assert torch.equal(flat[: zero.groups[0].layout.numel], zero.groups[0].master.to(torch.bfloat16))


def test_the_norm_is_exact_where_fp32_squares_overflow_and_inf_anywhere_skips(world_of_one):
    """``partition_norm_sq`` sums fp32 pieces; finite gradients whose squares overflow fp32 (1e20) get
    the exact float64 sum, and an inf/nan outside the counted ranges (a model-parallel replica) still
    says overflow."""
    from ds_zero._step import NORM_CHUNK, partition_norm_sq

    cpu = torch.device("cpu")
    g = torch.full((NORM_CHUNK + 10,), 0.5)
    assert partition_norm_sq([(g, None)], cpu, None, None) == pytest.approx(0.25 * g.numel(), rel=1e-6)
    big = torch.tensor([1e20, 3.0, -1e20])
    exact = 2 * float(big[0]) ** 2 + 9.0  # in float64, from the fp32 values
    assert partition_norm_sq([(big, None)], cpu, None, None) == pytest.approx(exact, rel=1e-12)
    assert partition_norm_sq([(big, [(1, 2)])], cpu, None, None) == 9.0  # only the counted range
    for bad in (float("inf"), float("nan")):
        replica = torch.tensor([1.0, 2.0, bad])
        assert partition_norm_sq([(g, None), (replica, [(0, 2)])], cpu, None, None) == float("inf")


def test_state_is_the_per_parameter_state_of_the_partitions_in_param_groups(world_of_one):
    """``.state`` as a torch optimizer exposes it (Lightning moves it between devices): keyed by the fp32
    partition in ``param_groups``, holding that partition's Adam moments."""
    model = nn.Linear(4, 3)
    zero = ZeroOptimizer(torch.optim.Adam(model.parameters(), lr=0.1), ZeroOptions(stage=2))
    assert len(zero.state) == 0
    zero.backward(model(torch.randn(2, 4)).sum())
    assert zero.step()
    (part,) = zero.param_groups[0]["params"]
    assert list(zero.state) == [part]
    assert zero.state[part]["exp_avg"].shape == part.shape == (15 + 1,)  # 15 elements padded to 2*dp
    tensors, _ = zero.sharded_state_dict()
    torch.testing.assert_close(zero.state[part]["exp_avg"][:15], tensors["g0.exp_avg"], rtol=0, atol=0)


def _allocations(fn, nbytes: int) -> int:
    """How many tensors of at least ``nbytes`` ``fn()`` allocates (torch's profiler: its allocating ops; an
    op's memory is also attributed to the ops that called it, which are not counted again)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    allocating = ("aten::empty", "aten::empty_strided")
    return sum(1 for e in prof.events() if e.name in allocating and e.cpu_memory_usage >= nbytes)


def test_the_norm_of_low_precision_gradients_casts_into_one_reused_buffer(world_of_one):
    """A bf16 gradient's fp32 norm is the same bits as ``vector_norm(piece, dtype=float32)`` per piece, and
    its cast goes through one buffer for the whole pass: one piece-sized allocation, not one per piece
    (on the CPU each one can be a fresh mmap whose page faults cost more than the norm)."""
    from ds_zero._step import NORM_CHUNK, partition_norm_sq

    cpu = torch.device("cpu")
    g = torch.randn(4 * NORM_CHUNK + 7, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    pieces = [
        torch.linalg.vector_norm(g[c : c + NORM_CHUNK], dtype=torch.float32)
        for c in range(0, g.numel(), NORM_CHUNK)
    ]
    expected = torch.stack(pieces).double().square().sum().item()
    assert partition_norm_sq([(g, None)], cpu, None, None) == expected
    assert _allocations(lambda: partition_norm_sq([(g, None)], cpu, None, None), NORM_CHUNK * 4) == 1


def test_sub_groups_scale_their_low_precision_gradients_in_one_reused_buffer():
    """``SubGroups.step`` gives each view ``grad * inv_scale`` in fp32 (the values of ``grad.float() *
    inv_scale``) through one view-sized buffer for the step, not one allocation per view."""
    from ds_zero.stage3._subgroups import SubGroups

    views, n = 5, 1 << 16
    master = torch.zeros(views * n)
    groups = SubGroups([master], n)
    grad = torch.randn(views * n, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    seen = []

    class Recorder(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})

        def step(self, closure=None):
            seen.extend(p.grad.clone() for g in self.param_groups for p in g["params"] if p.grad is not None)

    opt = Recorder(groups.views[0])
    assert _allocations(lambda: groups.step(opt, [grad], 0.25), n * 4) == 1 + views  # the buffer + the clones
    assert torch.equal(torch.cat(seen), grad.float() * 0.25)
