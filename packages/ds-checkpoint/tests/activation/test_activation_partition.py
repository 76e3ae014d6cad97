"""partition_activations across a real model-parallel group of 2 processes, plus CPU and contiguous saves."""

import numpy as np
import torch
import torch.distributed as dist
from act_models import assert_same_run, make_blocks, run_blocks
from ds_checkpoint.activation import checkpoint, configure, get_rng_tracker, model_parallel_manual_seed
from ds_checkpoint.activation._partition import gather_full, take_partition
from rank_testing import spawn
from torch.autograd.graph import saved_tensors_hooks

SHAPE = (2, 8, 16)  # (B, T, C): 256 elements, 128 per rank


class WorldMPU:
    """A model-parallel group spanning the whole world, in DeepSpeed's mpu protocol."""

    def get_model_parallel_rank(self):
        return dist.get_rank()

    def get_model_parallel_world_size(self):
        return dist.get_world_size()

    def get_model_parallel_group(self):
        return dist.group.WORLD


def _recording_checkpoint(saved):
    """checkpoint() that records (numel, device) of every tensor it saves for backward."""

    def pack(t):
        saved.append((t.numel(), t.device.type))
        return t

    def wrap(block, h):
        with saved_tensors_hooks(pack, lambda t: t):
            return checkpoint(block, h)

    return wrap


def _odd_sized(wrap):
    """Two 7-element inputs (not divisible by mp=2): padding must not leak into the gradients."""
    torch.manual_seed(4)
    t = torch.randn(7, requires_grad=True)
    w = torch.randn(7, requires_grad=True)
    out = wrap(lambda a, b: (a * b).tanh(), t, w)
    out.sum().backward()
    return out.detach(), t.grad, w.grad


def _partitioned_worker(rank, world_size):
    blocks = make_blocks(2)  # same seed on every rank: identical replicas
    torch.manual_seed(1)
    x = torch.randn(SHAPE)
    configure(None)
    plain = run_blocks(blocks, x, wrap=checkpoint)
    plain_odd = _odd_sized(checkpoint)
    results = {"plain": plain}
    variants = {
        "partitioned": {},
        "cpu": {"checkpoint_in_cpu": True},
        "contiguous": {"contiguous_checkpointing": True, "num_checkpoints": 2, "checkpoint_in_cpu": True},
    }
    for name, extra in variants.items():
        configure(WorldMPU(), partition_activations=True, **extra)
        saved = []
        runs = [run_blocks(blocks, x, wrap=_recording_checkpoint(saved)) for _ in range(2)]  # 2 steps
        results[name] = (runs, saved, _odd_sized(checkpoint))

    model_parallel_manual_seed(42)
    default = torch.rand(3)
    with get_rng_tracker().fork():
        model_parallel = torch.rand(3)
    results["seeds"] = (default, model_parallel)
    results["plain_odd"] = plain_odd
    return _to_numpy(results)


def _to_numpy(obj):
    """Tensors cross the process boundary by value (numpy), not through shared-memory handles."""
    if torch.is_tensor(obj):
        return obj.detach().numpy().copy()
    if isinstance(obj, dict):
        return {k: _to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_numpy(v) for v in obj)
    return obj


def _from_numpy(obj):
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, dict):
        return {k: _from_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_numpy(v) for v in obj)
    return obj


def test_partitioned_activations_over_two_processes_match_unpartitioned():
    results = [_from_numpy(r) for r in spawn(_partitioned_worker, 2)]
    for rank_result in results:
        plain = rank_result["plain"]
        for name in ("partitioned", "cpu", "contiguous"):
            runs, saved, odd = rank_result[name]
            for run in runs:
                assert_same_run(plain, run)
            for a, b in zip(rank_result["plain_odd"], odd):
                assert torch.equal(a, b)
            # One saved tensor per checkpoint call and step, each half of the (2, 8, 16) input.
            assert [numel for numel, _ in saved] == [128] * 4
            assert all(device == "cpu" for _, device in saved)
    # Both ranks hold identical replicas, yet the halves they saved differ: the split is real.
    default0, mp0 = results[0]["seeds"]
    default1, mp1 = results[1]["seeds"]
    assert torch.equal(default0, default1)
    assert not torch.equal(mp0, mp1)


def test_take_partition_pads_and_gather_trims_for_a_group_of_one():
    t = torch.arange(7.0).view(7, 1)
    part = take_partition(t, 0, 1)
    assert torch.equal(gather_full(part, t.shape, 1, None), t)


def test_partition_slices_are_the_ranks_contiguous_share():
    t = torch.arange(7.0)
    assert torch.equal(take_partition(t, 0, 2), torch.tensor([0.0, 1, 2, 3]))
    assert torch.equal(take_partition(t, 1, 2), torch.tensor([4.0, 5, 6, 0]))


def test_cpu_checkpointing_without_partitioning_matches():
    blocks = make_blocks(2)
    x = torch.randn(SHAPE)
    reference = run_blocks(blocks, x, wrap=None)
    configure(None, checkpoint_in_cpu=True)
    saved = []
    assert_same_run(reference, run_blocks(blocks, x, wrap=_recording_checkpoint(saved)))
    assert saved == [(256, "cpu")] * 2
