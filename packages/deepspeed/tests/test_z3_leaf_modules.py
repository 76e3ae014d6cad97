"""``deepspeed.utils``' ZeRO-3 leaf-module functions (Accelerate's ``transformer_moe_cls_names`` calls
``set_z3_leaf_modules``): the marking, DeepSpeed's attribute, and the errors. What stage 3 does with a leaf is
ds-zero's test (test_stage3_moe.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class Moe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(4, 2)
        self.branches = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Moe()
        self.b = Moe()
        self.head = nn.Linear(4, 1)


def test_set_get_unset_by_class_and_by_name():
    from deepspeed.utils import (
        get_z3_leaf_modules,
        set_z3_leaf_modules,
        unset_z3_leaf_modules,
        z3_leaf_module,
    )

    net = Net()
    assert get_z3_leaf_modules(net) == []
    assert set_z3_leaf_modules(net, [Moe]) == [net.a, net.b]
    assert net.a._z3_leaf is True and z3_leaf_module(net.b) and not z3_leaf_module(net.head)
    assert get_z3_leaf_modules(net) == [net.a, net.b]
    assert unset_z3_leaf_modules(net, ["Moe"]) == [net.a, net.b]
    assert get_z3_leaf_modules(net) == []
    qualified = f"{Moe.__module__}.{Moe.__qualname__}"
    assert set_z3_leaf_modules(net, [qualified]) == [net.a, net.b]


def test_by_name_suffix_and_single_module():
    from deepspeed.utils import get_z3_leaf_modules
    from deepspeed.utils.z3_leaf_module import (
        set_z3_leaf_module,
        set_z3_leaf_modules_by_name,
        set_z3_leaf_modules_by_suffix,
    )

    net = Net()
    assert set_z3_leaf_modules_by_name(net, ["a", "nope"], raise_if_not_found=False) == ([net.a], ["nope"])
    assert set_z3_leaf_modules_by_suffix(net, ["b"]) == ([net.b], [])
    set_z3_leaf_module(net.head, True)
    assert get_z3_leaf_modules(net) == [net.a, net.b, net.head]
    with pytest.raises(ValueError, match="no module named"):
        set_z3_leaf_modules_by_name(net, ["nope"])


def test_errors_name_the_problem():
    from deepspeed.utils import set_z3_leaf_modules

    with pytest.raises(ValueError, match="no module of class"):
        set_z3_leaf_modules(Net(), [nn.Conv2d])
    assert set_z3_leaf_modules(Net(), [nn.Conv2d], raise_if_not_found=False) == []
    with pytest.raises(TypeError, match="classes or class names"):
        set_z3_leaf_modules(Net(), [3])


def test_z3_leaf_parameter_is_deepspeeds_attribute():
    from deepspeed.utils import z3_leaf_parameter

    p = nn.Parameter(torch.zeros(1))
    assert not z3_leaf_parameter(p)
    p.ds_z3_leaf_module = nn.Linear(1, 1)
    assert z3_leaf_parameter(p)


def test_apply_zero_leaf_module_config_marks_classes_names_and_suffixes():
    from types import SimpleNamespace

    from deepspeed.utils.z3_leaf_module import apply_zero_leaf_module_config

    net = Net()
    assert apply_zero_leaf_module_config(net, None) == []
    cfg = SimpleNamespace(classes=["Moe"], names=[], name_suffixes=[])
    assert apply_zero_leaf_module_config(net, cfg) == [net.a, net.b]
    net = Net()
    cfg = SimpleNamespace(classes=[], names=["head"], name_suffixes=["b.gate"])
    assert apply_zero_leaf_module_config(net, cfg) == [net.head, net.b.gate]
    net = Net()  # DeepSpeed's defaults: no Hugging Face block here, nothing marked
    assert apply_zero_leaf_module_config(net, SimpleNamespace(**_defaults())) == []


def _defaults() -> dict:
    from ds_config import LeafModuleConfig

    return LeafModuleConfig().model_dump()
