"""``zero_optimization.leaf_module``: the modules initialize marks as ZeRO-3 leaves, as DeepSpeed 0.19.8's engine
does (``apply_zero_leaf_module_config`` in its ``_configure_distributed_model``).

At every stage, before anything is built: the classes (by class name or module-qualified name), the module
names and the name suffixes of the section get DeepSpeed's ``_z3_leaf`` flag (ds_zero.stage3's mark); stage 3
then gathers each such module whole, once for its forward and once for its backward. Below stage 3 the flag
has no effect (DeepSpeed sets it there too). The defaults are Hugging Face's Mixtral/Qwen2-MoE/Qwen3-MoE
sparse MoE blocks; a model without them is left as it is. Unmatched entries are no error: a warning when
they are not DeepSpeed's defaults, in DeepSpeed's cases.
"""

from __future__ import annotations

import logging

from ds_config import DEFAULT_LEAF_MODULE_CLASSES, LeafModuleConfig
from ds_zero.stage3 import _leaf, set_leaf_modules
from torch import nn

logger = logging.getLogger("ds")


def apply_leaf_module_config(model: nn.Module, section: LeafModuleConfig) -> list[nn.Module]:
    """Mark the modules ``section`` names; returns them (each once, in the order found)."""
    marked: list[nn.Module] = []

    def add(modules: list[nn.Module]) -> None:
        for m in modules:
            if not any(m is k for k in marked):
                marked.append(m)

    if section.classes:
        add(set_leaf_modules(model, section.classes, raise_if_not_found=False))
    named = list(model.named_modules())
    for keys, match, what in (
        (section.names, lambda name, key: name == key, "unknown module names"),
        (section.name_suffixes, lambda name, key: name.endswith(key), "unmatched module suffixes"),
    ):
        missing = []
        for key in keys:
            hits = [m for name, m in named if match(name, key)]
            for m in hits:
                setattr(m, _leaf.FLAG, True)
            add(hits)
            if not hits:
                missing.append(key)
        if missing:  # the defaults of names and suffixes are empty: any entry is the user's
            logger.warning("ZeRO leaf module configuration contains %s: %s", what, missing)
    customized = (
        section.classes != list(DEFAULT_LEAF_MODULE_CLASSES) or section.names or section.name_suffixes
    )
    if not marked and customized:
        logger.warning(
            "ZeRO leaf module configuration did not match any modules; hooks will be applied as usual"
        )
    return marked
