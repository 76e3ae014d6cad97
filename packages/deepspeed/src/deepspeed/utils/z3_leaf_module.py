"""DeepSpeed's ``deepspeed.utils.z3_leaf_module``: ZeRO-3 leaf modules, mapped onto ds_zero.stage3's.

A leaf module's parameters (its submodules' included) are gathered once for its forward and once for its
backward (mixture-of-experts blocks whose ranks run different experts). The mark is DeepSpeed's attribute
(``module._z3_leaf``); ds_zero.stage3._leaf has the mechanism.
"""

from __future__ import annotations

from collections.abc import Sequence

from ds_zero.stage3 import (
    _leaf,
    get_leaf_modules,
    is_leaf,
    is_leaf_parameter,
    set_leaf_modules,
    unset_leaf_modules,
)
from torch import nn

__all__ = [
    "apply_zero_leaf_module_config",
    "get_z3_leaf_modules",
    "set_z3_leaf_module",
    "set_z3_leaf_modules",
    "set_z3_leaf_modules_by_name",
    "set_z3_leaf_modules_by_suffix",
    "unset_z3_leaf_modules",
    "z3_leaf_module",
    "z3_leaf_parameter",
]


def z3_leaf_module(model: nn.Module) -> bool:
    """Whether ``model`` is marked as a leaf."""
    return is_leaf(model)


def z3_leaf_parameter(model: nn.Parameter) -> bool:
    """Whether the parameter (DeepSpeed names it ``model``) is inside a leaf module stage 3 hooked."""
    return is_leaf_parameter(model)


def get_z3_leaf_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` marked as leaves."""
    return get_leaf_modules(model)


def set_z3_leaf_modules(
    model: nn.Module, leaf_module_classes: Sequence[type | str], raise_if_not_found: bool = True
) -> list[nn.Module]:
    """Mark the modules of these classes (classes, or names plain or module-qualified); returns them."""
    return set_leaf_modules(model, leaf_module_classes, raise_if_not_found)


def unset_z3_leaf_modules(
    model: nn.Module, leaf_module_classes: Sequence[type | str], raise_if_not_found: bool = True
) -> list[nn.Module]:
    """Clear the mark of the modules of these classes; returns them."""
    return unset_leaf_modules(model, leaf_module_classes, raise_if_not_found)


def set_z3_leaf_module(model: nn.Module, flag: bool) -> None:
    """Mark (or unmark) ``model`` itself as a leaf."""
    setattr(model, _leaf.FLAG, flag)


def _by(model: nn.Module, keys: Sequence[str], match, flag: bool, raise_if_not_found: bool):
    found: list[nn.Module] = []
    missing: list[str] = []
    for key in keys:
        hits = [m for name, m in model.named_modules() if match(name, key)]
        if not hits:
            missing.append(key)
        for m in hits:
            setattr(m, _leaf.FLAG, flag)
            if not any(m is f for f in found):
                found.append(m)
    if missing and raise_if_not_found:
        raise ValueError(
            f"no module named {missing} in the model ({type(model).__name__}); see model.named_modules()"
        )
    return found, missing


def set_z3_leaf_modules_by_name(
    model: nn.Module, module_names: Sequence[str], flag: bool = True, raise_if_not_found: bool = True
) -> tuple[list[nn.Module], list[str]]:
    """Mark the modules of these ``named_modules()`` names; returns ``(modules, names not found)``."""
    return _by(model, module_names, lambda name, key: name == key, flag, raise_if_not_found)


def set_z3_leaf_modules_by_suffix(
    model: nn.Module, module_name_suffixes: Sequence[str], flag: bool = True, raise_if_not_found: bool = True
) -> tuple[list[nn.Module], list[str]]:
    """Mark the modules whose ``named_modules()`` name ends with one of the suffixes."""
    return _by(model, module_name_suffixes, lambda name, key: name.endswith(key), flag, raise_if_not_found)


def apply_zero_leaf_module_config(model: nn.Module, leaf_cfg) -> list[nn.Module]:
    """Mark the modules of a ``zero_optimization.leaf_module`` section (``ds_config.LeafModuleConfig``, or any
    object with ``classes``, ``names`` and ``name_suffixes``), as initialize does; ``None`` marks nothing.
    Returns the modules marked."""
    if leaf_cfg is None:
        return []
    from ds_config import LeafModuleConfig
    from ds_engine._leaf_config import apply_leaf_module_config

    if not isinstance(leaf_cfg, LeafModuleConfig):
        leaf_cfg = LeafModuleConfig(
            classes=list(leaf_cfg.classes),
            names=list(leaf_cfg.names),
            name_suffixes=list(leaf_cfg.name_suffixes),
        )
    return apply_leaf_module_config(model, leaf_cfg)
