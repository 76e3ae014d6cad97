"""The DeepSpeed module surface scripts import: accelerator, comm, utils, ops, and the missing features."""

from __future__ import annotations

import logging
import subprocess
import sys

import deepspeed
import ds_optim
import ds_sparse_attn
import pytest
import torch
from deepspeed import utils
from deepspeed.accelerator import real_accelerator as accelerator
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
from deepspeed.ops.lamb import FusedLamb


def test_accelerator_on_cpu_answers_what_scripts_ask(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr(accelerator, "_current", None)
    acc = accelerator.get_accelerator()
    assert acc is accelerator.get_accelerator()  # one per process
    assert acc.device_name() == "cpu" and acc.device_name(3) == "cpu" and acc.current_device_name() == "cpu"
    assert acc.device() == torch.device("cpu") and acc.device_count() == 1 and acc.is_available()
    assert acc.communication_backend_name() == "gloo"  # what ds_launch initialises on CPU
    assert acc.is_bf16_supported() and acc.is_fp16_supported()
    assert torch.bfloat16 in acc.supported_dtypes()
    acc.synchronize()
    acc.set_device(0)
    # streams and events are harmless no-ops; an event pair still measures host time
    stream = acc.Stream()
    with acc.stream(stream):
        start, end = acc.Event(enable_timing=True), acc.Event(enable_timing=True)
        start.record()
        end.record()
    acc.current_stream().wait_stream(stream)
    assert end.elapsed_time(start) <= 0.0 <= start.elapsed_time(end)
    # RNG: seeding and state round-trip through torch's CPU generator
    acc.manual_seed(7)
    state = acc.get_rng_state()
    a = torch.rand(3)
    acc.set_rng_state(state)
    assert torch.equal(a, torch.rand(3)) and acc.initial_seed() == 7
    t = torch.ones(2)
    assert acc.pin_memory(t) is t and acc.on_accelerator(t) and not acc.is_pinned(t)
    assert acc.memory_allocated() == 0 and acc.total_memory() > 0
    with pytest.raises(NotImplementedError, match="op builders"):
        acc.create_op_builder("FusedAdamBuilder")


def test_unknown_accelerator_names_the_supported_ones():
    with pytest.raises(ValueError, match="cuda, cpu"):
        accelerator.Accelerator("xpu")


_BEFORE_INIT = """
import torch, ds_engine
from deepspeed import comm
assert not comm.is_initialized()
assert comm.get_rank() == 0 and comm.get_world_size() == 1
comm.barrier()  # nothing to wait for
assert comm.ReduceOp.SUM is torch.distributed.ReduceOp.SUM
assert comm.all_reduce is torch.distributed.all_reduce  # the collectives are torch's own
assert comm.init_distributed is ds_engine.init_distributed
"""


def test_comm_before_initialisation_is_a_world_of_one():
    # a fresh interpreter: other tests in this process leave a world-of-one group initialised
    subprocess.run([sys.executable, "-c", _BEFORE_INIT], check=True)


def test_log_dist_logs_on_the_listed_ranks_only(caplog):
    with caplog.at_level(logging.INFO, logger="ds_engine"):
        utils.log_dist("hello", ranks=[0])
        utils.log_dist("not me", ranks=[1])
    assert "hello" in caplog.text and "not me" not in caplog.text
    assert utils.logger is logging.getLogger("ds_engine")


def _one_step(opt_cls, **kwargs):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(16))
    opt = opt_cls([p], lr=0.1, weight_decay=0.1, **kwargs)
    p.grad = torch.randn(16)
    opt.step()
    return p.detach()


def test_fused_adam_is_adamw_and_l2_adam_by_adam_w_mode():
    assert torch.allclose(_one_step(FusedAdam), _one_step(torch.optim.AdamW), atol=1e-6)
    assert torch.allclose(_one_step(FusedAdam, adam_w_mode=False), _one_step(torch.optim.Adam), atol=1e-6)
    assert not torch.allclose(
        _one_step(FusedAdam, adam_w_mode=False), _one_step(torch.optim.AdamW), atol=1e-6
    )
    assert torch.allclose(_one_step(DeepSpeedCPUAdam), _one_step(torch.optim.AdamW), atol=1e-6)
    assert issubclass(FusedAdam, ds_optim.CPUAdam) and issubclass(FusedLamb, ds_optim.Lamb)
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedAdam([torch.nn.Parameter(torch.ones(1))], amsgrad=True)


def test_fused_lamb_steps_like_ds_optim_lamb():
    assert torch.equal(_one_step(FusedLamb, max_grad_norm=1.0), _one_step(ds_optim.Lamb))


def test_sparse_attention_seed_era_path_is_ds_sparse_attn():
    from deepspeed.ops import sparse_attention

    for name in sparse_attention.__all__:
        assert getattr(sparse_attention, name) is getattr(ds_sparse_attn, name)


@pytest.mark.parametrize(
    ("make", "feature"),
    [
        (lambda: deepspeed.init_inference(torch.nn.Linear(2, 2)), "inference engine"),
    ],
)
def test_missing_features_fail_at_use_naming_the_feature(make, feature):
    with pytest.raises(deepspeed.FeatureNotAvailableError, match=feature):
        make()


# DeepSpeed 0.19.8's CPU accelerator's device_count(), recorded by
# tools/fixtures/make_deepspeed_behaviour_fixtures.py ("device_count" in ds-engine's deepspeed_behaviour.json)
_RECORDED_DEVICE_COUNT = {"LOCAL_SIZE=3": 3, "LOCAL_SIZE=None": 1}


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"LOCAL_SIZE": "3"}, _RECORDED_DEVICE_COUNT["LOCAL_SIZE=3"]),
        ({}, _RECORDED_DEVICE_COUNT["LOCAL_SIZE=None"]),
        ({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, 4),  # torchrun / ds-launch
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 2),
    ],
)
def test_cpu_device_count_is_the_local_world_size(monkeypatch, env, expected):
    for name in ("LOCAL_SIZE", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert accelerator.get_accelerator().device_count() == expected
