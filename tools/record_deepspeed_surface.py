"""Record DeepSpeed 0.19.8's public surface: every module, every public name, its kind and signature.

Run from the repository root with the real DeepSpeed (CPU accelerator), never with ds's package:

    env -u PYTHONPATH DS_ACCELERATOR=cpu /work/refenv/bin/python tools/record_deepspeed_surface.py

Writes ``packages/deepspeed/tests/fixtures/deepspeed_0.19.8_surface.json``, which
``tools/check_deepspeed_surface.py`` checks ds's ``deepspeed`` package against (in CI through
``packages/deepspeed/tests/test_surface.py``). Every module ``pkgutil.walk_packages`` finds is imported in
this one process; one that fails to import on CPU is recorded with its error.

What counts as a module's public name (the rest is noise that would make the record useless to check):

- a package ``__init__`` keeps every public name (not starting with ``_``) it binds: packages re-export on
  purpose (``deepspeed.comm.get_rank``, ``deepspeed.utils.logger``);
- any other module keeps the names its own source binds at top level (``def``, ``class``, assignments),
  those it star-imports from a DeepSpeed module (``deepspeed.runtime.config`` re-exports its constants
  that way: ``ADAM_OPTIMIZER``), and those in its ``__all__``; a plain ``from x import y`` is the module's
  own dependency, not its API (``deepspeed.runtime.engine.get_accelerator`` is not recorded);
- everywhere, modules, classes and functions that belong to another distribution (torch, typing, pydantic,
  the standard library: ``Module``, ``Optional``, ``dist``) are dropped: they are not DeepSpeed's API;
- plus :data:`PRIVATE`, the private names published code uses (each with who uses it).

Each name records its kind (``module``, ``class``, ``function``, ``constant``, ``object``), a signature
as ``[name, kind, default repr]`` triples (kind: ``p`` positional-only, ``pk`` positional-or-keyword,
``*`` var-positional, ``k`` keyword-only, ``**`` var-keyword; no third item: no default), a constant's type
and (when it is small and JSON-able) value, and for a class its public methods (defined in DeepSpeed's
classes of its MRO, not inherited from torch or the standard library) with their signatures.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import pkgutil
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "packages/deepspeed/tests/fixtures/deepspeed_0.19.8_surface.json"
VERSION = "0.19.8"

# Private names that published code reaches for (module path -> names, or "Class._method"), with the user.
PRIVATE = {
    # transformers' integrations/deepspeed.py compares torch.arange against it when zero.Init patches it
    "deepspeed.runtime.zero.partition_parameters": ["_orig_torch_arange"],
    # transformers' Trainer.save_model and Accelerate's get_state_dict at ZeRO 3
    "deepspeed.runtime.engine": ["DeepSpeedEngine._zero3_consolidated_16bit_state_dict"],
    # Lightning's convert_zero_checkpoint_to_fp32_state_dict and DeepSpeed's own zero_to_fp32 script users
    "deepspeed.utils.zero_to_fp32": ["_get_fp32_state_dict_from_zero_checkpoint"],
    # DeepSpeed's unit tests and user code skip what the machine cannot run: deepspeed.ops.__compatible_ops__[NAME]
    "deepspeed.ops": ["__compatible_ops__"],
    # transformers' and Accelerate's sequence-parallel loss (the first); Megatron-DeepSpeed and DeepSpeed's own
    # engine (the data-parallel getters, which answer where the public ones assert)
    "deepspeed.utils.groups": [
        "_get_sequence_parallel_group",
        "_get_data_parallel_group",
        "_get_data_parallel_world_size",
        "_get_data_parallel_rank",
        "_get_model_parallel_world_size",
        "_get_broadcast_src_rank",
    ],
}
# Calls whose results code depends on (path, args): recorded as the value returned or the exception's class,
# compared by packages/deepspeed/tests/test_surface_behaviour.py.
CALLS = [
    ("deepspeed.checkpoint.utils.get_model_ckpt_name_for_rank", ["ckpt/global_step3", "00"]),
    ("deepspeed.checkpoint.utils.get_model_ckpt_name_for_rank", ["/abs/dir", "07"]),
    ("deepspeed.checkpoint.utils.get_zero_ckpt_name_for_rank", ["ckpt/global_step3", 1, 0]),
    ("deepspeed.checkpoint.utils.get_zero_ckpt_name_for_rank", ["ckpt", 12, 3]),
    ("deepspeed.checkpoint.utils.get_layer_ckpt_name_for_rank", ["ckpt", "layer_01", 2]),
    ("deepspeed.utils.numa.parse_range", ["3"]),
    ("deepspeed.utils.numa.parse_range", ["2-5"]),
    ("deepspeed.utils.numa.parse_range", ["5-2"]),
    ("deepspeed.utils.numa.parse_range", ["1-2-3"]),
    ("deepspeed.utils.numa.parse_range", ["x"]),
    ("deepspeed.utils.numa.parse_range_list", ["0-3,8,10-11"]),
    ("deepspeed.utils.numa.parse_range_list", ["0-3,2"]),
    ("deepspeed.utils.numa.parse_range_list", ["4,1"]),
    ("deepspeed.utils.torch.required_torch_version", [2.1]),
    ("deepspeed.utils.torch.required_torch_version", ["2.2", "99.0"]),
    ("deepspeed.utils.torch.required_torch_version", [None, 1.0]),
    ("deepspeed.utils.torch.required_torch_version", []),
]
# Engines whose optimizer code tests with isinstance: config additions (a client torch AdamW, world of 1)
ENGINES = {
    "fp32.zero0": {},
    "bf16.zero0": {"bf16": {"enabled": True}},
    "fp32.zero1": {"zero_optimization": {"stage": 1}},
    "bf16.zero1": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}},
    "bf16.zero1.fp32_accum": {
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1},
        "data_types": {"grad_accum_dtype": "fp32"},
    },
    "fp32.zero2": {"zero_optimization": {"stage": 2}},
    "bf16.zero2": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}},
    "fp32.zero3": {"zero_optimization": {"stage": 3}},
    "bf16.zero3": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}},
}
# DeepSpeed's optimizer classes, by path
OPTIMIZER_CLASSES = [
    "deepspeed.runtime.base_optimizer.DeepSpeedOptimizer",
    "deepspeed.runtime.base_optimizer.ZeROOptimizer",
    "deepspeed.runtime.bf16_optimizer.BF16_Optimizer",
    "deepspeed.runtime.fp16.fused_optimizer.FP16_Optimizer",
    "deepspeed.runtime.fp16.unfused_optimizer.FP16_UnfusedOptimizer",
    "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer",
    "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3",
]
_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "p",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "pk",
    inspect.Parameter.VAR_POSITIONAL: "*",
    inspect.Parameter.KEYWORD_ONLY: "k",
    inspect.Parameter.VAR_KEYWORD: "**",
}
# an import that builds an op waits on torch's build lock while another process compiles it: give up and
# record it as not importing rather than hang (run again once the op is built)
IMPORT_TIMEOUT_S = 120
_SMALL = 200  # characters of JSON above which a constant's value is not recorded (its type is)


def signature(obj: Any) -> list[list[str]] | None:
    """``[[name, kind, default repr?], ...]`` or None where Python cannot tell (builtins, some C types)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        item = [p.name, _KINDS[p.kind]]
        if p.default is not inspect.Parameter.empty:
            item.append(_short_repr(p.default))
        out.append(item)
    return out


def _short_repr(value: Any) -> str:
    text = repr(value)
    if " at 0x" in text:  # an object's address changes every run
        text = f"<{type(value).__module__}.{type(value).__qualname__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _is_deepspeeds(obj: Any) -> bool:
    module = getattr(obj, "__name__", "") if inspect.ismodule(obj) else getattr(obj, "__module__", None) or ""
    return module == "deepspeed" or module.startswith("deepspeed.")


def _source_names(module: Any) -> tuple[set[str], set[str]]:
    """Names the module's source binds at top level, and the DeepSpeed modules it star-imports."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return set(), set()
    bound, stars = set(), set()
    for node in tree.body:
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(sub.name)
            elif isinstance(sub, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            bound.add(name.id)
            elif isinstance(sub, ast.ImportFrom) and any(a.name == "*" for a in sub.names):
                base = (
                    module.__name__
                    if module.__file__.endswith("__init__.py")
                    else module.__name__.rpartition(".")[0]
                )
                for _ in range(max(sub.level - 1, 0)):
                    base = base.rpartition(".")[0]
                stars.add(f"{base}.{sub.module}" if sub.level else sub.module)
    return bound, stars


def _public_names(module: Any) -> list[str]:
    is_package = hasattr(module, "__path__")
    declared = set(getattr(module, "__all__", []) or [])
    if is_package:
        names = {n for n in vars(module) if not n.startswith("_")} | declared
    else:
        bound, stars = _source_names(module)
        names = {n for n in bound if not n.startswith("_")} | declared
        for star in stars:
            if star and star.startswith("deepspeed"):
                star_module = sys.modules.get(star)
                if star_module is not None:
                    names |= set(_public_names(star_module))
    keep = []
    for name in sorted(names):
        if not hasattr(module, name):
            continue
        value = getattr(module, name)
        if (
            inspect.ismodule(value) or inspect.isclass(value) or inspect.isroutine(value)
        ) and not _is_deepspeeds(value):
            continue  # torch, typing, the standard library: not DeepSpeed's API
        if type(value).__module__ in ("typing", "typing_extensions"):
            continue  # Optional, Dict, Callable: typing's aliases
        keep.append(name)
    return keep


def describe(value: Any) -> dict[str, Any]:
    if inspect.ismodule(value):
        return {"kind": "module", "target": value.__name__}
    if inspect.isclass(value):
        entry: dict[str, Any] = {"kind": "class", "defined": _defined(value)}
        entry["signature"] = signature(value)
        entry["methods"] = _methods(value)
        if hasattr(value, "model_fields"):  # a pydantic model: its fields are what code reads
            entry["fields"] = sorted(value.model_fields)
        return entry
    if inspect.isroutine(value) or (callable(value) and hasattr(value, "__wrapped__")):
        return {"kind": "function", "defined": _defined(value), "signature": signature(value)}
    entry = {
        "kind": "constant"
        if isinstance(value, (bool, int, float, str, bytes, type(None), tuple, list, dict, set, frozenset))
        else "object"
    }
    entry["type"] = f"{type(value).__module__}.{type(value).__qualname__}"
    if entry["kind"] == "constant":
        try:
            text = json.dumps(value, sort_keys=True)
        except (TypeError, ValueError):
            text = None
        if text is not None and len(text) <= _SMALL and not isinstance(value, (set, frozenset)):
            entry["value"] = json.loads(text)  # a copy (module globals change later), tuples as lists
    return entry


def _defined(value: Any) -> str:
    return f"{getattr(value, '__module__', None)}.{getattr(value, '__qualname__', None)}"


def _share_reexports(modules: dict[str, Any]) -> None:
    """A class or function recorded where it is defined is, where re-exported, ``{"kind", "ref"}``."""
    for module, entry in modules.items():
        for name, item in entry["names"].items():
            defined = item.get("defined", "")
            home, _, qualname = defined.rpartition(".")
            if (
                defined
                and defined != f"{module}.{name}"
                and qualname in modules.get(home, {}).get("names", {})
            ):
                entry["names"][name] = {"kind": item["kind"], "ref": defined}


def _methods(cls: type) -> dict[str, Any]:
    """Public methods and properties a DeepSpeed class of ``cls``'s MRO defines."""
    out: dict[str, Any] = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None or not _is_deepspeeds(owner):
            continue
        raw = vars(owner)[name]
        if isinstance(raw, property):
            out[name] = {"kind": "property"}
        elif isinstance(raw, (staticmethod, classmethod)) or inspect.isfunction(raw):
            kind = (
                "staticmethod"
                if isinstance(raw, staticmethod)
                else "classmethod"
                if isinstance(raw, classmethod)
                else "method"
            )
            out[name] = {"kind": kind, "signature": signature(getattr(raw, "__func__", raw))}
    return out


def record() -> dict[str, Any]:
    import deepspeed

    modules: dict[str, Any] = {}
    failed: dict[str, str] = {}

    def onerror(name: str) -> None:
        failed[name] = _error_text()

    names = ["deepspeed"] + [
        m.name for m in pkgutil.walk_packages(deepspeed.__path__, "deepspeed.", onerror=onerror)
    ]
    for name in names:
        signal.alarm(IMPORT_TIMEOUT_S)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - a module that cannot import on CPU is recorded as such
            failed[name] = _error_text()
            continue
        finally:
            signal.alarm(0)
        entry: dict[str, Any] = {}
        for public in _public_names(module):
            entry[public] = describe(getattr(module, public))
        for private in PRIVATE.get(name, []):
            owner, _, attr = private.rpartition(".")
            if private.startswith("__"):
                entry[private] = describe(getattr(module, private))
            elif owner:
                cls_entry = entry[owner]
                raw = inspect.getattr_static(getattr(module, owner), attr)
                cls_entry["methods"][attr] = {"kind": "method", "signature": signature(raw)}
            else:
                entry[private] = describe(getattr(module, private))
        modules[name] = {"package": hasattr(module, "__path__"), "names": entry}
    for name in failed:
        modules.pop(name, None)
    _share_reexports(modules)
    return {
        "deepspeed": deepspeed.__version__,
        "recorded_with": f"python {sys.version.split()[0]}, torch {sys.modules['torch'].__version__}, DS_ACCELERATOR={os.environ.get('DS_ACCELERATOR')}",
        "private": PRIVATE,
        "modules": dict(sorted(modules.items())),
        "import_errors": dict(sorted(failed.items())),
        "behaviour": record_behaviour(),
    }


class ImportTimeout(Exception):
    """The import did not finish within IMPORT_TIMEOUT_S."""


def _alarm(signum: int, frame: Any) -> None:
    raise ImportTimeout(f"import took more than {IMPORT_TIMEOUT_S} s (an op build waiting on a lock?)")


def _resolve(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def call_result(path: str, args: list[Any]) -> dict[str, Any]:
    """``{"returned": JSON value}`` or ``{"raised": exception class name}`` (ranges become lists)."""
    try:
        value = _resolve(path)(*args)
    except Exception as exc:  # noqa: BLE001 - the class is what is recorded
        return {"raised": type(exc).__name__}
    return {"returned": list(value) if isinstance(value, range) else value}


def optimizer_classes(deepspeed: Any, torch: Any, extra: dict[str, Any]) -> dict[str, bool]:
    """Which of OPTIMIZER_CLASSES ``isinstance`` holds for, for the engine built with ``extra``."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if extra.get("bf16", {}).get("enabled") else torch.float32
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).to(dtype)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True, **extra}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine = deepspeed.initialize(model=model, optimizer=optimizer, config=config)[0]
    return {path: isinstance(engine.optimizer, _resolve(path)) for path in OPTIMIZER_CLASSES}


def record_behaviour() -> dict[str, Any]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    import deepspeed
    import torch

    calls = [{"path": path, "args": args, **call_result(path, args)} for path, args in CALLS]
    engines = {name: optimizer_classes(deepspeed, torch, extra) for name, extra in ENGINES.items()}
    return {"calls": calls, "engines": {"configs": ENGINES, "isinstance": engines}}


def _error_text() -> str:
    exc = sys.exc_info()[1]
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def main() -> None:
    import deepspeed

    if "+ds." in deepspeed.__version__ or not deepspeed.__version__.startswith(VERSION):
        raise SystemExit(
            f"this records the real DeepSpeed {VERSION}; imported {deepspeed.__version__} from {deepspeed.__file__}"
        )
    signal.signal(signal.SIGALRM, _alarm)
    data = record()
    OUT.write_text(json.dumps(data, indent=0, separators=(",", ":")) + "\n")
    count = sum(len(m["names"]) for m in data["modules"].values())
    print(
        f"wrote {OUT}: {len(data['modules'])} modules, {count} names, {len(data['import_errors'])} modules that do not import on CPU, {OUT.stat().st_size} bytes"
    )


if __name__ == "__main__":
    main()
