"""Each activation_checkpointing key, from the config section, has an effect a test can see.

partition_activations (saved numel), contiguous_memory_optimization (one storage), number_checkpoints
(exhaustion) and profile (timings) are observed in the other files; here: the section-to-settings mapping
of all six keys, the synchronize calls, and (on CUDA) where cpu_checkpointing puts the saved inputs.
"""

import pytest
import torch
from act_models import make_blocks, run_blocks
from ds_checkpoint.activation import ActivationCheckpointingSettings, _checkpoint, checkpoint, configure
from ds_config import load_config
from torch.autograd.graph import saved_tensors_hooks

SHAPE = (2, 8, 16)
EVERY_KEY_SET = {
    "partition_activations": True,
    "cpu_checkpointing": True,
    "contiguous_memory_optimization": True,
    "number_checkpoints": 3,
    "synchronize_checkpoint_boundary": True,
    "profile": True,
}


def test_every_key_of_the_section_reaches_the_settings():
    cfg = load_config({"train_batch_size": 1, "activation_checkpointing": EVERY_KEY_SET})
    assert configure(None, deepspeed_config=cfg) == ActivationCheckpointingSettings(**EVERY_KEY_SET)


@pytest.mark.parametrize("synchronize, calls_per_checkpoint", [(False, 0), (True, 4)])
def test_synchronize_checkpoint_boundary_synchronizes_at_each_boundary(
    monkeypatch, synchronize, calls_per_checkpoint
):
    """Before and after the forward, and before and after the backward, of every checkpoint() call."""
    calls = []
    real = _checkpoint.synchronize_device
    monkeypatch.setattr(_checkpoint, "synchronize_device", lambda: calls.append(1) or real())
    cfg = load_config(
        {"train_batch_size": 1, "activation_checkpointing": {"synchronize_checkpoint_boundary": synchronize}}
    )
    configure(None, deepspeed_config=cfg)
    run_blocks(make_blocks(2), torch.randn(SHAPE), wrap=checkpoint)
    assert len(calls) == 2 * calls_per_checkpoint


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device: on a CPU the inputs are already there"
)
@pytest.mark.parametrize("cpu_checkpointing, device", [(False, "cuda"), (True, "cpu")])
def test_cpu_checkpointing_saves_the_inputs_on_the_cpu(cpu_checkpointing, device):
    cfg = load_config(
        {"train_batch_size": 1, "activation_checkpointing": {"cpu_checkpointing": cpu_checkpointing}}
    )
    configure(None, deepspeed_config=cfg)
    blocks = make_blocks(2).cuda()
    saved = []

    def wrap(block, h):
        with saved_tensors_hooks(lambda t: saved.append(t.device.type) or t, lambda t: t):
            return checkpoint(block, h)

    run_blocks(blocks, torch.randn(SHAPE, device="cuda"), wrap=wrap)
    assert saved == [device, device]
