"""checkpoint() gives the same values and gradients as running the function directly."""

import pytest
import torch
from act_models import assert_same_run, make_blocks, run_blocks
from ds_checkpoint.activation import checkpoint
from torch import nn


def test_transformer_blocks_with_dropout_match_uncheckpointed_run():
    blocks = make_blocks(3)
    x = torch.randn(2, 8, 16)
    reference = run_blocks(blocks, x, wrap=None)
    checkpointed = run_blocks(blocks, x, wrap=checkpoint)
    assert_same_run(reference, checkpointed)


def test_mlp_with_dropout_matches_and_dropout_is_active():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.5), nn.Linear(32, 8))
    blocks = nn.ModuleList([mlp])
    x = torch.randn(4, 8)
    reference = run_blocks(blocks, x, wrap=None, seed=7)
    checkpointed = run_blocks(blocks, x, wrap=checkpoint, seed=7)
    assert_same_run(reference, checkpointed)
    # Another seed draws another mask: the equality above is not dropout being a no-op.
    assert not torch.equal(run_blocks(blocks, x, wrap=None, seed=8)[0], reference[0])


def test_backward_leaves_the_callers_rng_stream_untouched():
    blocks = make_blocks(2)
    x = torch.randn(2, 8, 16, requires_grad=True)
    torch.manual_seed(5)
    loss = checkpoint(blocks[1], checkpoint(blocks[0], x)).sum()
    before = torch.get_rng_state()
    loss.backward()
    assert torch.equal(torch.get_rng_state(), before)


def test_non_tensor_arguments_and_several_outputs():
    torch.manual_seed(0)
    lin = nn.Linear(6, 6)

    def fn(x, scale, mode, mask):
        y = lin(x) * scale
        if mode == "double":
            y = y * 2
        index = mask.nonzero()[:, 0]  # integer output: non-differentiable
        frozen = (x * 3).detach()  # floating output that does not need grad
        return y, index, frozen, "label"

    x = torch.randn(5, 6, requires_grad=True)
    mask = torch.tensor([1, 0, 1, 1, 0])
    y, index, frozen, label = checkpoint(fn, x, 0.5, "double", mask)
    assert label == "label"
    assert torch.equal(index, torch.tensor([0, 2, 3]))
    assert not index.requires_grad
    y.sum().backward()
    expected_w = lin.weight.grad.clone()
    expected_x = x.grad.clone()

    lin.weight.grad = None
    x.grad = None
    (lin(x) * 0.5 * 2).sum().backward()
    assert torch.equal(lin.weight.grad, expected_w)
    assert torch.equal(x.grad, expected_x)
    assert torch.equal(frozen, x.detach() * 3)


def test_only_some_outputs_used_in_loss():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    out_a, out_b = checkpoint(lambda t: (a(t), b(t)), x)
    out_b.sum().backward()
    assert a.weight.grad is None
    expected = torch.autograd.grad(b(x).sum(), b.weight)[0]
    assert torch.equal(b.weight.grad, expected)


def test_parameters_get_gradients_when_no_input_requires_grad():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4)  # e.g. the first layer's input: data, not a grad-requiring activation
    checkpoint(lin, x).sum().backward()
    assert lin.weight.grad is not None
    assert torch.equal(lin.weight.grad, torch.autograd.grad(lin(x).sum(), lin.weight)[0])


def test_autograd_grad_raises_deepspeeds_error():
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    out = checkpoint(lin, x).sum()
    with pytest.raises(RuntimeError, match=r"not compatible with \.grad\(\), please use \.backward\(\)"):
        torch.autograd.grad(out, x)


def test_no_grad_is_a_plain_call():
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4)
    with torch.no_grad():
        out = checkpoint(lin, x)
    assert out.grad_fn is None
    assert torch.equal(out, lin(x).detach())


def test_function_returning_a_list_is_rejected_with_what_to_return():
    with pytest.raises(TypeError, match="must return a tensor or a tuple"):
        checkpoint(lambda t: [t * 2], torch.randn(2, requires_grad=True))


def test_in_place_change_of_a_saved_input_is_detected():
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    h = x * 1
    out = checkpoint(lin, h).sum()
    with torch.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


class CountingMPU:
    """A model-parallel group of one that counts how often checkpoint() asks it anything."""

    def __init__(self):
        self.calls = 0

    def get_model_parallel_rank(self):
        self.calls += 1
        return 0

    def get_model_parallel_world_size(self):
        self.calls += 1
        return 1

    def get_model_parallel_group(self):
        self.calls += 1
        return None


@pytest.mark.parametrize("partition", [False, True])
def test_options_are_paid_for_only_when_on(partition):
    from ds_checkpoint.activation import configure, get_profile

    mpu = CountingMPU()
    configure(mpu, partition_activations=partition)
    mpu.calls = 0  # configure() validates the mpu once
    blocks = make_blocks(2)
    x = torch.randn(2, 8, 16)
    assert_same_run(run_blocks(blocks, x, wrap=None), run_blocks(blocks, x, wrap=checkpoint))
    # Partitioning needs the group's rank and size; with it off the mpu is never consulted.
    assert (mpu.calls > 0) == partition
    assert get_profile().forward_ms == [] and get_profile().recompute_ms == []
