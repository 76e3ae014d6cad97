"""The optimizers DeepSpeed's config builds, and DeepSpeedCPUAdam's extras, against DeepSpeed 0.19.8's record.

The record is ``fixtures/deepspeed_behaviour.json`` (``tools/fixtures/make_deepspeed_behaviour_fixtures.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import ds_engine
import pytest
import torch
from ds_optim import DeepSpeedCPUAdam, FusedAdam

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_behaviour.json").read_text())
CONFIG_CASES = {
    "Adam": ({"type": "Adam"}, False),
    "AdamW": ({"type": "AdamW"}, False),
    "Adam.torch_adam": ({"type": "Adam", "params": {"torch_adam": True}}, False),
    "AdamW.torch_adam": ({"type": "AdamW", "params": {"torch_adam": True}}, False),
    "Adam.adam_w_mode=False.torch_adam": (
        {"type": "Adam", "params": {"torch_adam": True, "adam_w_mode": False}},
        False,
    ),
    "Adam.offload": ({"type": "Adam"}, True),
}


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_config_adam_builds_deepspeeds_class_and_defaults(case):
    optimizer, offload = CONFIG_CASES[case]
    config = {"train_micro_batch_size_per_gpu": 1, "optimizer": optimizer}
    if offload:
        config["zero_optimization"] = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    opt = ds_engine.initialize(model=_net(), config=config)[0].basic_optimizer
    expected = RECORD["config_optimizer"][case]
    names = [c.__name__ for c in type(opt).__mro__]
    assert names[0] == expected["mro"][0] and set(expected["mro"]) <= set(names)
    assert opt.param_groups[0]["weight_decay"] == expected["weight_decay"]
    if names[0] in ("FusedAdam", "DeepSpeedCPUAdam"):
        assert isinstance(opt, FusedAdam if names[0] == "FusedAdam" else DeepSpeedCPUAdam)


@pytest.mark.parametrize("fp32_states", [True, False])
def test_cpu_adam_fp32_optimizer_states(fp32_states):
    p = torch.nn.Parameter(torch.linspace(-1, 1, 8).to(torch.bfloat16))
    opt = DeepSpeedCPUAdam([p], lr=0.1, fp32_optimizer_states=fp32_states)
    p.grad = torch.linspace(0.5, -0.5, 8).to(torch.bfloat16)
    opt.step()
    expected = RECORD["cpu_adam"][f"fp32_optimizer_states={fp32_states}"]
    assert str(opt.state[p]["exp_avg"].dtype) == expected["exp_avg_dtype"]
    assert p.dtype == torch.bfloat16
    assert p.float().tolist() == expected["param_after"]


def _subgroup_run(adamw: bool, bias_correction: bool = True):
    p = torch.nn.Parameter(torch.linspace(-1, 1, 8))
    opt = DeepSpeedCPUAdam([p], lr=0.1, weight_decay=0.1, adamw_mode=adamw, bias_correction=bias_correction)
    p.grad = torch.linspace(0.5, -0.5, 8)
    opt.step_subgroup(7)
    one = (p.detach().clone(), opt.state[7]["exp_avg"].clone(), opt.state[7]["exp_avg_sq"].clone())
    opt.step_subgroup(7)
    two = p.detach().clone()
    opt.rollback_subgroup(7)
    return opt, p, one, two


def test_step_subgroup_and_rollback_match_deepspeed_in_adamw_mode():
    opt, p, one, two = _subgroup_run(adamw=True)
    expected = RECORD["cpu_adam"]["subgroup.adamw_mode=True"]
    assert [str(k) for k in opt.state] == expected["state_keys"]
    torch.testing.assert_close(two, torch.tensor(expected["after_two_steps"]), rtol=0, atol=1e-6)
    torch.testing.assert_close(p.detach(), torch.tensor(expected["after_rollback"]), rtol=0, atol=1e-6)
    torch.testing.assert_close(opt.state[7]["exp_avg"], torch.tensor(expected["exp_avg_after_rollback"]))
    assert int(opt.state[7]["step"]) == expected["step_after_rollback"]


@pytest.mark.parametrize("adamw", [True, False])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_rollback_is_the_exact_inverse_of_the_step(adamw, bias_correction):
    """DeepSpeed undoes every step with AdamW's formula (its Adam-mode rollback misses the L2 term, see
    docs/deepspeed-api.md); ds inverts the step that ran."""
    opt, p, one, _ = _subgroup_run(adamw, bias_correction)
    torch.testing.assert_close(p.detach(), one[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(opt.state[7]["exp_avg"], one[1], rtol=0, atol=1e-6)
    torch.testing.assert_close(opt.state[7]["exp_avg_sq"], one[2], rtol=0, atol=1e-7)


def test_subgroup_errors():
    opt = DeepSpeedCPUAdam([torch.nn.Parameter(torch.ones(2))])
    expected = RECORD["cpu_adam"]["rollback_uninitialised"]
    with pytest.raises(RuntimeError) as info:
        opt.rollback_subgroup(0)
    assert str(info.value) == expected["message"]
    two = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))]
    opt = DeepSpeedCPUAdam(two)
    for q in two:
        q.grad = torch.ones_like(q)
    with pytest.raises(ValueError, match="exactly one parameter"):
        opt.step_subgroup(0)


def test_empty_partition_cache_frees_gathered_stage3_parameters():
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW"},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    engine = ds_engine.initialize(model=_net(), config=config)[0]
    params = engine.optimizer.params
    params.gather(params.slots.values())  # as a forward, or a GatheredParameters, leaves them
    assert params.live_numel > 0 and all(p.numel() > 0 for p in engine.module.parameters())
    engine.empty_partition_cache()
    assert params.live_numel == 0 and all(p.numel() == 0 for p in engine.module.parameters())
    engine.backward(engine(torch.randn(1, 4)).sum())  # and training goes on
    engine.step()
    stage1 = ds_engine.initialize(model=_net(), config={**config, "zero_optimization": {"stage": 1}})[0]
    stage1.empty_partition_cache()  # nothing to free below stage 3


@pytest.mark.parametrize(
    "fp16, expected",
    [
        ({"enabled": True, "initial_scale_power": 8}, (True, True, 256.0, 1000, 1.0)),
        ({"enabled": True, "loss_scale": 128}, (True, False, 128.0, None, None)),
        (None, (False, False, 1.0, None, None)),
    ],
)
def test_zero_optimizer_loss_scale_config(fp16, expected):
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW"},
        "zero_optimization": {"stage": 2},
    }
    if fp16:
        config["fp16"] = fp16
    model = _net().half() if fp16 else _net()
    optimizer = ds_engine.initialize(model=model, config=config)[0].optimizer
    got = optimizer.loss_scale_config
    assert (
        got.use_grad_scaling,
        got.dynamic_loss_scale,
        got.cur_scale,
        got.scale_window,
        got.min_loss_scale,
    ) == (expected)
    assert optimizer.dynamic_loss_scale is expected[1]


def test_stage3_parameters_carry_deepspeeds_attributes():
    from ds_zero.stage3 import ZeroParamStatus  # deepspeed.runtime.zero.partition_parameters re-exports it

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW"},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    with ds_engine.zero.Init(config_dict_or_path=config):
        built = _net()
    shapes = {"0.weight": (8, 4), "0.bias": (8,), "2.weight": (1, 8), "2.bias": (1,)}
    for name, p in built.named_parameters():  # cut at construction: numel() is 0, ds_numel is not
        assert p.numel() == 0 and p.ds_numel == torch.Size(shapes[name]).numel()
        assert p.ds_status == ZeroParamStatus.NOT_AVAILABLE and tuple(p.ds_shape) == shapes[name]
    engine = ds_engine.initialize(model=built, config=config)[0]
    params = dict(engine.module.named_parameters())
    assert len({p.ds_id for p in params.values()}) == len(params)
    for name, p in params.items():
        assert p.ds_status == ZeroParamStatus.NOT_AVAILABLE and tuple(p.ds_shape) == shapes[name]
        assert p.ds_numel == p.ds_tensor.numel()  # one rank holds the whole partition
    with ds_engine.zero.GatheredParameters(list(params.values())):
        for p in params.values():
            assert p.ds_status == ZeroParamStatus.AVAILABLE
            torch.testing.assert_close(p.ds_tensor, p.detach().reshape(-1))
    assert all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in params.values())


def test_zero_init_remote_nvme_keeps_partitions_in_memory_until_initialize_moves_them(tmp_path, caplog):
    """``zero.Init(remote_device="nvme")`` (what Lightning's ``deepspeed_stage_3_offload_nvme`` strategy
    opens around ``configure_model``): the partitions stay in CPU memory while the model is built, said
    once in the log; ``initialize`` moves them into the parameter swap files (observed: the files hold
    every weight), and the run trains as with ``remote_device="cpu"``. A config without parameters on nvme
    is refused (nothing would ever reach the disk)."""
    import logging

    def config(nvme_path) -> dict:
        zero = {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}}
        zero["offload_param"] = {"device": "nvme", "nvme_path": str(nvme_path), "max_in_cpu": 0}
        return {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"}, "zero_optimization": zero}

    with pytest.raises(ValueError, match="offload_param.device is 'nvme'"):
        ds_engine.zero.Init(remote_device="nvme", config_dict_or_path={"zero_optimization": {"stage": 3}})
    losses = {}
    for remote in ("cpu", "nvme"):
        path = tmp_path / remote
        path.mkdir()
        ds_engine.zero._said_nvme.clear()
        with caplog.at_level(logging.WARNING, logger="ds_engine"):
            with ds_engine.zero.Init(remote_device=remote, config_dict_or_path=config(path)):
                built = _net()
        said = "keeps this rank's partitions in CPU memory" in caplog.text
        assert said == (remote == "nvme"), caplog.text
        caplog.clear()
        assert all(p.ds_tensor.device.type == "cpu" for p in built.parameters())
        engine = ds_engine.initialize(model=built, config=config(path))[0]
        numel = sum(p.ds_numel for p in built.parameters())
        data = (path / "ds_swap_params" / "rank00000" / "g0.param.bin").read_bytes()
        assert len(data) - data.count(0) >= 0.99 * 4 * numel, "the weights are not in the swap file"
        losses[remote] = []
        for step in range(2):
            x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
            loss = engine(x).pow(2).mean()
            engine.backward(loss)
            engine.step()
            losses[remote].append(loss.item())
    assert losses["nvme"] == losses["cpu"]
