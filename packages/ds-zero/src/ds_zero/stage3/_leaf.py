"""Leaf modules: stage 3 gathers a leaf module's parameters (its submodules' included) all at once, for its
whole forward and again for its whole backward, and puts no hooks inside it.

For mixture-of-experts blocks: which experts run depends on the tokens, so ranks run different experts;
with a gather per expert, ranks would issue different collectives and stop. A leaf block is one gather
on every rank whatever its routing. The flag is DeepSpeed's attribute (``module._z3_leaf``), so a module
marked through ``deepspeed.utils.set_z3_leaf_modules`` is a leaf here too; a parameter inside a leaf gets
DeepSpeed's ``ds_z3_leaf_module`` attribute (the leaf module) when stage 3 installs its hooks.

Without any marking, the owner of a ``ModuleList``/``ModuleDict`` named like a list of experts
(``EXPERT_LIST_NAMES``) is a leaf too (``auto_leaf``): such a block's experts run by routing, and gathering
them one by one is what stops DeepSpeed's stage 3 when ranks route differently.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from torch import nn

__all__ = [
    "EXPERT_LIST_NAMES",
    "auto_leaf",
    "get_leaf_modules",
    "is_leaf",
    "is_leaf_parameter",
    "set_leaf_modules",
    "unset_leaf_modules",
    "walk_hooked_modules",
]

FLAG = "_z3_leaf"  # DeepSpeed's attribute name, so both spellings of the marking agree
PARAM_FLAG = "ds_z3_leaf_module"
EXPERT_LIST_NAMES = ("experts", "local_experts", "deepspeed_experts")


def _matches(module: nn.Module, classes: Sequence[type | str]) -> bool:
    cls = type(module)
    for c in classes:
        if isinstance(c, type) and isinstance(module, c):
            return True
        if isinstance(c, str) and c in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}"):
            return True
    return False


def _flag(
    model: nn.Module, classes: Sequence[type | str], value: bool, raise_if_not_found: bool
) -> list[nn.Module]:
    if not all(isinstance(c, type | str) for c in classes):
        raise TypeError(f"leaf module classes must be classes or class names, got {list(classes)!r}")
    found = [m for m in model.modules() if _matches(m, classes)]
    for m in found:
        setattr(m, FLAG, value)
    if not found and raise_if_not_found:
        names = [c if isinstance(c, str) else c.__name__ for c in classes]
        raise ValueError(
            f"no module of class {names} in the model ({type(model).__name__}); name a class the model "
            "uses (its class, its name or its module-qualified name), or pass raise_if_not_found=False"
        )
    return found


def set_leaf_modules(
    model: nn.Module, classes: Sequence[type | str], raise_if_not_found: bool = True
) -> list[nn.Module]:
    """Mark every module of ``model`` that is an instance of one of ``classes`` (classes, or class names,
    plain or module-qualified) as a leaf; returns the modules marked. Call it before stage 3 is built."""
    return _flag(model, classes, True, raise_if_not_found)


def unset_leaf_modules(
    model: nn.Module, classes: Sequence[type | str], raise_if_not_found: bool = True
) -> list[nn.Module]:
    """Clear the leaf mark of the modules of ``classes``; returns them."""
    return _flag(model, classes, False, raise_if_not_found)


def is_leaf(module: nn.Module) -> bool:
    return bool(getattr(module, FLAG, False))


def get_leaf_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if is_leaf(m)]


def is_leaf_parameter(param: nn.Parameter) -> bool:
    return hasattr(param, PARAM_FLAG)


def auto_leaf(module: nn.Module) -> bool:
    """A module holding a list of experts by one of ``EXPERT_LIST_NAMES`` (see the module docstring)."""
    return any(isinstance(module._modules.get(n), nn.ModuleList | nn.ModuleDict) for n in EXPERT_LIST_NAMES)


def walk_hooked_modules(model: nn.Module) -> Iterator[tuple[nn.Module, bool]]:
    """``(module, leaf)`` for every module stage 3 hooks: all of them, except those inside a leaf."""
    stack = [model]
    seen: set[int] = set()
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        leaf = is_leaf(m) or (getattr(m, FLAG, None) is None and auto_leaf(m))
        yield m, leaf
        if not leaf:
            stack.extend(reversed(list(m.children())))
