"""Contiguous buffers (exhaustion, release, reset), profile timings and boundary synchronisation."""

import logging

import pytest
import torch
from act_models import assert_same_run, make_blocks, run_blocks
from ds_checkpoint.activation import (
    CheckpointBuffersExhaustedError,
    checkpoint,
    configure,
    get_profile,
    reset,
)
from torch.autograd.graph import saved_tensors_hooks

SHAPE = (2, 8, 16)


def _contiguous(num_checkpoints):
    configure(
        None, partition_activations=True, contiguous_checkpointing=True, num_checkpoints=num_checkpoints
    )


def test_more_calls_than_number_checkpoints_names_the_key():
    blocks = make_blocks(3)
    _contiguous(2)
    with pytest.raises(CheckpointBuffersExhaustedError, match=r"number_checkpoints=2.*number_checkpoints"):
        run_blocks(blocks, torch.randn(SHAPE), wrap=checkpoint)


def test_exhaustion_is_an_index_error_like_deepspeeds():
    assert issubclass(CheckpointBuffersExhaustedError, IndexError)


def test_saved_inputs_share_one_preallocated_block_and_are_released_by_backward():
    blocks = make_blocks(3)
    x = torch.randn(SHAPE)
    reference = run_blocks(blocks, x, wrap=None)
    _contiguous(3)
    saved = []

    def wrap(block, h):
        with saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            return checkpoint(block, h)

    for _ in range(2):  # a second step works only if backward released the slots
        saved.clear()
        assert_same_run(reference, run_blocks(blocks, x, wrap=wrap))
        pointers = [t.data_ptr() for t in saved]
        row_bytes = saved[0].numel() * saved[0].element_size()
        assert pointers == [pointers[0] + i * row_bytes for i in range(3)]  # consecutive rows of one buffer


def test_reset_releases_buffers_after_a_forward_without_backward():
    blocks = make_blocks(2)
    x = torch.randn(SHAPE, requires_grad=True)
    _contiguous(2)
    for block in blocks:
        checkpoint(block, x)  # e.g. an evaluation pass with gradients enabled, never backpropagated
    with pytest.raises(CheckpointBuffersExhaustedError):
        checkpoint(blocks[0], x)
    reset()
    checkpoint(blocks[0], x)


def test_contiguous_rejects_a_size_change_at_the_same_position():
    _contiguous(4)
    lin = torch.nn.Linear(16, 16)
    checkpoint(lin, torch.randn(2, 16, requires_grad=True))
    with pytest.raises(ValueError, match="same size and dtype"):
        checkpoint(lin, torch.randn(3, 16, requires_grad=True))


def test_profile_records_forward_recompute_and_backward_times(caplog):
    blocks = make_blocks(2)
    configure(None, profile=True)
    with caplog.at_level(logging.INFO, logger="ds_checkpoint.activation"):
        run_blocks(blocks, torch.randn(SHAPE), wrap=checkpoint)
    profile = get_profile()
    assert len(profile.forward_ms) == len(profile.recompute_ms) == len(profile.backward_ms) == 2
    assert all(ms > 0 for ms in profile.forward_ms + profile.recompute_ms + profile.backward_ms)
    phases = [r.getMessage().split(":")[0] for r in caplog.records]
    assert phases.count("activation checkpoint forward") == 2
    assert phases.count("activation checkpoint recompute") == 2
    assert "forward: 2 calls" in profile.summary()


def test_profile_off_records_nothing():
    configure(None)
    run_blocks(make_blocks(1), torch.randn(SHAPE), wrap=checkpoint)
    assert get_profile().forward_ms == []


def test_synchronize_boundary_keeps_results_identical():
    blocks = make_blocks(2)
    x = torch.randn(SHAPE)
    reference = run_blocks(blocks, x, wrap=None)
    configure(None, synchronize=True)
    assert_same_run(reference, run_blocks(blocks, x, wrap=checkpoint))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_dropout_grads_and_cpu_checkpointing_match():
    blocks = make_blocks(2).cuda()
    x = torch.randn(SHAPE, device="cuda")
    reference = run_blocks(blocks, x, wrap=None)
    configure(None, checkpoint_in_cpu=True, synchronize=True, profile=True)
    saved = []

    def wrap(block, h):
        with saved_tensors_hooks(lambda t: saved.append(t.device.type) or t, lambda t: t):
            return checkpoint(block, h)

    assert_same_run(reference, run_blocks(blocks, x, wrap=wrap))
    assert saved == ["cpu", "cpu"]
