"""ZeRO stage 3 on real ranks (gloo, world sizes 1, 2, 4): parity with plain torch, what each rank holds.

One spawn per world size runs every check (spawning is the expensive part).
"""

from __future__ import annotations

import _stage3_workers as w
import pytest
import torch
from ds_zero import ZeroConfigError, ZeroStage3Optimizer
from ds_zero.stage3 import Stage3Options
from rank_testing import spawn

FP32_TOL = 2e-6


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"world{n}")
def world(request) -> tuple[int, list[dict]]:
    return request.param, spawn(w.world_main, request.param, timeout_s=600)


def test_training_matches_plain_torch(world):
    _, results = world
    for rank, r in enumerate(results):
        bad = {name: err for name, err in r["parity"].items() if err > FP32_TOL}
        assert not bad, f"rank {rank}: weights differ from plain torch: {bad}"


def test_each_rank_holds_only_its_partition(world):
    n, results = world
    for r in results:
        p = r["partition"]
        assert p["whole_after_step"] == {}, "no parameter may stay whole after a step (threshold 0)"
        assert p["partition_numel"] <= p["total_numel"] // n + 2 * n  # 1/N of the flat space (+ padding)
        assert p["master_is_partition"], "fp32 training keeps one copy: the master is the weight partition"
        assert set(p["state_numel"].values()) == {p["partition_numel"]}, "optimizer state is the partition's"


def test_gradient_partition_lives_from_backward_to_step(world):
    _, results = world
    for r in results:
        p = r["partition"]
        assert all(p["grad_held_after_backward"]), "a backward reduces into the partition gradient"
        assert all(p["grad_freed_after_step"]), "nothing reads the partition gradient after the step: freed"


def test_weights_autograd_saved_in_forward_are_freed_with_the_release(world):
    _, results = world
    for r in results:
        saved = r["saved"]
        assert saved["saved_weight_views"] > 0, "nn.Linear saves a view of its weight for backward"
        assert saved["held_bytes"] == 0, "a released weight's saved view must not keep its gathered copy"


def test_gathered_working_set_is_one_module_at_a_time(world):
    _, results = world
    for r in results:
        p = r["partition"]
        # the tied embedding/head weight is the largest; at most it and one other module are whole at once
        assert p["peak_live_numel"] < p["total_numel"] // 2 + p["largest_module_numel"]


def test_persistence_threshold_keeps_small_parameters_whole(world):
    n, results = world
    for r in results:
        persist, plain = r["persist"], r["partition"]
        assert set(persist["whole_after_step"]) == {
            "l2.bias",
            "l1.bias",
            "norm.weight",
            "norm.bias",
            "unused.weight",
            "unused.bias",
        }
        assert all(v <= 50 for v in persist["whole_after_step"].values())
        if n > 1:  # whole parameters need no gather in forward or backward, only a refresh after the step
            assert persist["gathered_numel_per_step"] < plain["gathered_numel_per_step"]


def test_model_persistence_threshold_caps_the_resident_total(world):
    """DeepSpeed's rule: in model order, a small parameter stays whole while the total stays within the cap."""
    _, results = world
    for r in results:
        # l1.bias 16, l2.bias 8, norm.weight 8, norm.bias 8 make 40; unused.weight (9) would pass it, and so
        # would unused.bias (3) after it: partitioned like the large ones
        assert r["persist_capped"]["whole_after_step"] == {
            "l1.bias": 16, "l2.bias": 8, "norm.weight": 8, "norm.bias": 8
        }  # fmt: skip


def test_a_module_fetch_is_one_collective(world):
    """Coalescing: a module's parameters travel together, not one collective per parameter and owner."""
    n, results = world
    if n == 1:
        pytest.skip("one rank gathers nothing")
    for r in results:
        c = r["coalescing"]
        # shared memory (the transport of a one-host gloo job): one collective per module forward
        assert c["off"]["transport"] == c["off"]["gather_calls"] == len(w.FORWARD_MODULES)
        # prefetch: the embedding's own fetch, then one prefetch of every module after it
        assert c["prefetch"]["transport"] == c["prefetch"]["gather_calls"] == 2
        # torch.distributed: one broadcast per owner of each module's flat run, each element sent once
        t = c["torch"]
        assert t["calls"] == {"c10d.broadcast_": t["owners_per_module"]}
        assert t["owners_per_module"] < t["owners_per_parameter"]
        assert t["bytes"] == 4 * t["module_numel"]


def test_reduce_bucket_size_sets_the_number_of_reductions(world):
    n, results = world
    if n == 1:
        pytest.skip("one rank reduces nothing")
    for r in results:
        small, big = r["partition"]["reduces_per_step"], r["big_bucket"]["reduces_per_step"]
        assert big <= n  # one bucket: one reduce per owner
        assert small > big  # several buckets: several reductions per owner


def test_small_bucket_buffers_are_reused_not_allocated_each_backward(world):
    _, results = world
    for r in results:
        assert r["partition"]["bucket_buffers_allocated_per_step"] == 0, "kept from the first step"
        assert r["overlap"]["bucket_buffers_allocated_per_step"] == 0
        # kept only within KEEP_BYTES: with 0, every bucket of every backward allocates its buffer
        no_keep = r["no_keep"]
        assert no_keep["bucket_buffers_allocated_per_step"] == no_keep["buckets"] > 1


def test_overlap_comm_keeps_two_reductions_in_flight(world):
    _, results = world
    for r in results:
        plain, overlap = r["partition"], r["overlap"]
        assert plain["peak_inflight"] == 0, "without overlap_comm each reduction completes at its launch"
        assert overlap["peak_inflight"] == 2, "overlap_comm: one bucket fills while two are in flight"
        assert overlap["reduces_per_step"] == plain["reduces_per_step"]  # the same reductions, only later


def test_bf16_keeps_fp32_masters(world):
    _, results = world
    for r in results:
        b = r["bf16"]
        assert (b["master_dtype"], b["partition_dtype"], b["gathered_dtype"]) == (
            "torch.float32",
            "torch.bfloat16",
            "torch.bfloat16",
        )
        assert b["error"] < 3e-2  # bf16 forward/backward against the fp32 reference, 3 steps


def test_a_tied_parameter_gathers_into_one_tensor_under_both_names(world):
    """As in module.state_dict(): save_pretrained drops the tied name only when both share one tensor."""
    _, results = world
    assert all(r["bf16"]["tied_names_share_one_tensor"] for r in results)


def test_gathered_parameters_modifier_rank_reaches_every_partition(world):
    _, results = world
    for r in results:
        g = r["gathered"]
        assert g["whole_inside"] == w.WIDTH * 16 and g["released_after"] == 0
        assert g["weight_values"] == [0.5]
        assert not g["bias_has_7"], "without modifier_rank a change must be discarded"


def test_model_built_inside_partition_on_construction(world):
    n, results = world
    for r in results:
        c = r["construct"]
        assert set(c["held"].values()) == {0}, "a parameter stayed whole after construction"
        assert c["chunk_numel"] <= c["total_numel"] // n + 16 * n
        assert c["error"] == 0.0
        assert c["init_restored"]


def test_fp16_overflow_on_one_rank_skips_everywhere(world):
    _, results = world
    for r in results:
        f = r["fp16"]
        assert f["skipped"] and f["unchanged"] and f["applied_next"]
        assert f["scale"] == 512.0 and f["updates"] == [True, False]


def test_parameter_used_outside_its_module_needs_registration(world):
    _, results = world
    for r in results:
        e = r["external"]
        assert str(e["register=False"]).startswith("error"), "a released weight must never be used silently"
        assert e["register=True"] < FP32_TOL


def test_elementwise_optimizer_steps_small_views_with_identical_results(monkeypatch):
    import torch.distributed as dist
    from ds_zero.stage3 import _subgroups
    from rank_testing import free_port

    def train(optimizer_cls: type, options: Stage3Options) -> tuple[list[int], dict]:
        torch.manual_seed(0)
        model = w.Net()
        zero = ZeroStage3Optimizer(model, optimizer_cls(model.parameters(), lr=1e-2), options)
        w.train(model, zero, 0, 1, 2, 1)
        return [v.numel() for v in zero.sub_groups.views[0]], zero.module_state_dict()

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        options = Stage3Options(param_persistence_threshold=0)
        whole, ref = train(torch.optim.AdamW, options)
        monkeypatch.setattr(_subgroups, "STEP_PIECE", 7)
        pieces, cut = train(torch.optim.AdamW, options)
        # torch's optimizers allocate temporaries as large as the tensor they update: small views, small ones
        assert len(whole) == 1 and max(pieces) == 7 and sum(pieces) == whole[0]
        assert all(torch.equal(cut[k], v) for k, v in ref.items()), "element-wise: the cut changes nothing"
        untested = Stage3Options(param_persistence_threshold=0, allow_untested_optimizer=True)
        views, _ = train(torch.optim.Rprop, untested)
        assert views == whole, "an optimizer not known element-wise keeps sub_group_size's cut"
    finally:  # later test files make their own group
        dist.destroy_process_group()


def test_untested_optimizer_is_rejected_with_the_key_to_set():
    import torch.distributed as dist
    from rank_testing import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = w.Net()
        with pytest.raises(ZeroConfigError, match="zero_allow_untested_optimizer") as raised:
            ZeroStage3Optimizer(model, torch.optim.LBFGS(model.parameters()), Stage3Options())
        assert isinstance(raised.value, AssertionError)  # what DeepSpeed raises there (an assert)
    finally:  # later test files make their own group
        dist.destroy_process_group()


def _config(zero: dict, **top: object):
    from ds_config import load_config

    return load_config(
        {"train_batch_size": 2, "zero_optimization": {"stage": 3, **zero}, **top}, world_size=1
    )


def test_options_from_config_read_the_keys():
    opts = Stage3Options.from_config(
        _config(
            {
                "stage3_param_persistence_threshold": 7,
                "stage3_model_persistence_threshold": 70,
                "reduce_bucket_size": 99,
                "overlap_comm": True,
                "stage3_gather_fp16_weights_on_model_save": True,
                "offload_param": {"device": "cpu"},
                "stage3_prefetch_bucket_size": 11,
                "stage3_max_live_parameters": 12,
                "stage3_max_reuse_distance": 13,
                "sub_group_size": 14,
            },
            gradient_clipping=0.5,
            prescale_gradients=True,
            gradient_predivide_factor=4.0,
            zero_allow_untested_optimizer=True,
            bf16={"enabled": True, "grad_accum_dtype": "fp32"},
        )
    )
    assert (opts.param_persistence_threshold, opts.reduce_bucket_size, opts.overlap_comm) == (7, 99, True)
    assert opts.model_persistence_threshold == 70
    assert opts.gather_16bit_weights_on_model_save and opts.offload_param and not opts.offload_optimizer
    assert (opts.prefetch_bucket_size, opts.max_live_parameters, opts.max_reuse_distance) == (11, 12, 13)
    assert opts.sub_group_size == 14
    assert (opts.clip_grad, opts.prescale_gradients, opts.gradient_predivide_factor) == (0.5, True, 4.0)
    assert opts.allow_untested_optimizer and opts.grad_accum_dtype == torch.float32
    from ds_config import DSConfig, ZeroConfig

    # offload_param nvme: each key reaches the parameter swap's options (their effects: test_stage3_param_nvme.py)
    nvme = DSConfig(zero_optimization=ZeroConfig(stage=3, offload_param={
        "device": "nvme", "nvme_path": "/p", "buffer_count": 3, "buffer_size": 7, "max_in_cpu": 9, "pin_memory": True}))  # fmt: skip
    p = Stage3Options.from_config(nvme).param_nvme
    assert (p.nvme_path, p.buffer_count, p.buffer_size, p.max_in_cpu, p.pin_memory) == ("/p", 3, 7, 9, True)


def test_from_config_wires_the_top_level_keys_into_the_optimizer():
    """The engine's one call: the averaging rule, clipping and accumulation dtype come from the config."""
    import torch.distributed as dist
    from rank_testing import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = w.Net().to(torch.bfloat16)
        cfg = _config(
            {},
            gradient_clipping=0.5,
            prescale_gradients=True,
            gradient_predivide_factor=4.0,
            bf16={"enabled": True, "grad_accum_dtype": "fp32"},
        )
        zero = ZeroStage3Optimizer.from_config(model, torch.optim.AdamW(model.parameters()), cfg)
        assert zero.clip_grad == 0.5
        assert (zero.grads.rule.prescale, zero.grads.rule.predivide) == (True, 4.0)
        assert set(zero.grad_parts.dtypes) == {torch.float32}
    finally:  # later test files make their own group
        dist.destroy_process_group()


def test_schedule_keys_keep_training_identical(world):
    _, results = world
    for rank, r in enumerate(results):
        bad = {name: c["error"] for name, c in r["schedule"].items() if c["error"] > FP32_TOL}
        assert not bad, f"rank {rank}: prefetch/reuse/live bound/sub-groups changed the weights: {bad}"


def test_prefetch_gathers_the_next_modules_before_they_run(world):
    _, results = world
    for r in results:
        off, on = r["schedule"]["off"], r["schedule"]["prefetch"]
        assert off["ready_before_forward"] == 0 and off["prefetch_calls"] == 0
        # every module but the first of the step (the embedding, fetched by the step's first event)
        total = on["gathered_numel"]  # forward + backward traffic of the whole model
        assert on["ready_before_forward"] > 0 and on["prefetch_calls"] > 0
        assert on["ready_before_forward"] >= total // 2 - w.VOCAB * w.WIDTH  # all of forward but emb
        assert on["gathered_numel"] == off["gathered_numel"]  # the same gathers, only earlier


def test_max_reuse_distance_keeps_parameters_used_again_soon(world):
    n, results = world
    for r in results:
        off, reuse = r["schedule"]["off"], r["schedule"]["reuse"]
        # kept from the end of forward into backward instead of being released and gathered again
        assert reuse["peak_live_numel"] > off["peak_live_numel"]
        assert reuse["ready_before_forward"] == w.VOCAB * w.WIDTH  # the head's weight, tied to the embedding
        if n > 1:  # one rank gathers with no collective
            assert reuse["gathered_numel"] < off["gathered_numel"]


def test_max_live_parameters_bounds_the_gathered_working_set(world):
    n, results = world
    for r in results:
        s = r["schedule"]
        largest_module = 16 * w.WIDTH + 16  # l1
        for name in ("reuse-live150", "all-live150"):
            assert s[name]["peak_live_numel"] <= 150 + largest_module, name
        assert s["reuse-live150"]["peak_live_numel"] < s["reuse"]["peak_live_numel"]
        if n > 1:  # released beyond the bound, so gathered again
            assert s["reuse-live150"]["gathered_numel"] > s["reuse"]["gathered_numel"]


def test_sub_group_size_steps_the_optimizer_a_sub_group_at_a_time(world):
    _, results = world
    for r in results:
        off, sub = r["schedule"]["off"], r["schedule"]["off-sub50"]
        n = sub["partition_numel"]
        assert off["optimizer_calls"] == [n]
        assert sub["optimizer_calls"] == [min(50, n - lo) for lo in range(0, n, 50)]
        assert sub["state"] == off["state"], "the checkpointed optimizer state must not depend on the cut"


def test_a_forward_outside_the_trace_keeps_training_identical_and_nothing_whole(world):
    _, results = world
    for r in results:
        e = r["schedule"]["all-eval"]
        # the eval forward follows the trace's forward, then the training forward leaves it: what was kept
        # is released, training is unchanged (checked with the others) and a step leaves nothing whole
        assert e["whole_after_eval"] is not None and e["whole_after_step"] == 0
        assert all(c["whole_after_step"] == 0 for c in r["schedule"].values())


def test_state_is_the_per_parameter_state_of_the_views_in_param_groups():
    """``.state`` as a torch optimizer exposes it: keyed by the sub-group views in ``param_groups``."""
    import torch.distributed as dist
    from rank_testing import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = w.Net()
        zero = ZeroStage3Optimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2), Stage3Options())
        w.train(model, zero, 0, 1, 2, 1)
        views = [p for g in zero.param_groups for p in g["params"]]
        assert list(zero.state) == views and zero.state is zero.optimizer.state
        assert all(zero.state[v]["exp_avg_sq"].shape == v.shape for v in views)
        assert all(zero.state[v]["exp_avg_sq"].abs().sum() > 0 for v in views)
        assert set(zero.state_dict()) == {"tensors", "meta"}
    finally:
        dist.destroy_process_group()
