"""The model-parallel RNG tracker (CPU generator here: no CUDA) and its replay in recomputation."""

import pytest
import torch
from ds_checkpoint.activation import (
    RNGTrackerError,
    checkpoint,
    configure,
    get_cuda_rng_tracker,
    get_rng_tracker,
    model_parallel_manual_seed,
)
from torch import nn


def test_cuda_name_is_the_same_tracker():
    assert get_cuda_rng_tracker() is get_rng_tracker()


def test_add_seeds_a_named_state_without_touching_the_current_one():
    tracker = get_rng_tracker()
    torch.manual_seed(1)
    before = torch.get_rng_state()
    tracker.add("mp", 1234)
    assert torch.equal(torch.get_rng_state(), before)
    with tracker.fork("mp"):
        drawn = torch.rand(3)
    torch.manual_seed(1234)
    assert torch.equal(drawn, torch.rand(3))


def test_fork_continues_the_named_stream_and_restores_the_default_one():
    tracker = get_rng_tracker()
    tracker.add("mp", 99)
    torch.manual_seed(0)
    default_expected = torch.rand(4)
    torch.manual_seed(0)
    with tracker.fork("mp"):
        first = torch.rand(2)
    with tracker.fork("mp"):
        second = torch.rand(2)
    assert torch.equal(torch.rand(4), default_expected)  # the default stream did not advance
    torch.manual_seed(99)
    assert torch.equal(torch.cat([first, second]), torch.rand(4))  # the named one did, across forks


def test_fork_restores_on_exception():
    tracker = get_rng_tracker()
    tracker.add("mp", 5)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with pytest.raises(ValueError), tracker.fork("mp"):
        torch.rand(1)
        raise ValueError("inside")
    assert torch.equal(torch.get_rng_state(), before)


def test_tracker_errors_match_deepspeed():
    tracker = get_rng_tracker()
    tracker.add("a", 1)
    with pytest.raises(RNGTrackerError, match="seed 1 already exists"):
        tracker.add("b", 1)
    with pytest.raises(RNGTrackerError, match="rng state a already exists"):
        tracker.add("a", 2)
    with pytest.raises(RNGTrackerError, match="rng state nope is not added"), tracker.fork("nope"):
        pass


def test_get_and_set_states_rewind_a_stream():
    tracker = get_rng_tracker()
    tracker.add("mp", 7)
    saved = tracker.get_states()
    with tracker.fork("mp"):
        first = torch.rand(3)
    tracker.set_states(saved)
    with tracker.fork("mp"):
        assert torch.equal(torch.rand(3), first)
    tracker.reset()
    assert tracker.get_states() == {}


class RankMPU:
    def __init__(self, rank):
        self.rank = rank

    def get_model_parallel_rank(self):
        return self.rank

    def get_model_parallel_world_size(self):
        return 4

    def get_model_parallel_group(self):
        return None


def test_model_parallel_manual_seed_offsets_by_mp_rank():
    draws = {}
    for rank in (0, 3):
        configure(RankMPU(rank))
        model_parallel_manual_seed(10)
        default = torch.rand(2)
        with get_rng_tracker().fork():
            draws[rank] = (default, torch.rand(2))
    assert torch.equal(draws[0][0], draws[3][0])  # default stream identical across the MP group
    assert not torch.equal(draws[0][1], draws[3][1])  # model-parallel stream differs per MP rank
    torch.manual_seed(10 + 2718 + 3)
    assert torch.equal(draws[3][1], torch.rand(2))


def test_dropout_inside_a_tracker_fork_is_replayed_in_recomputation():
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    drop = nn.Dropout(0.5)

    def fn(x):
        with get_rng_tracker().fork():
            h = drop(lin(x))
        return drop(h) * 2  # and one dropout on the default stream

    def run(wrap):
        lin.weight.grad = None
        model_parallel_manual_seed(3)
        x = torch.randn(6, 8, requires_grad=True)
        out = wrap(fn, x)
        # Advance both streams after the forward: recomputation must not see these draws.
        torch.rand(5)
        with get_rng_tracker().fork():
            torch.rand(5)
        out.sum().backward()
        return out.detach(), lin.weight.grad.clone(), x.grad.clone()

    plain = run(lambda f, x: f(x))
    ckpt = run(checkpoint)
    for a, b in zip(plain, ckpt):
        assert torch.equal(a, b)
