"""DeepSpeed 0.19.8's public surface against ds's ``deepspeed``, and the behaviour behind the names filled for it.

The record is ``fixtures/deepspeed_0.19.8_surface.json`` (``tools/fixtures/record_deepspeed_surface.py``, run with the
real DeepSpeed); the check is ``tools/checks/check_deepspeed_surface.py`` with its table
``tools/checks/deepspeed_surface_table.py``; docs/deepspeed-api.md is generated from both.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import deepspeed
import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_0.19.8_surface.json").read_text())
BEHAVIOUR = RECORD["behaviour"]


def _tool():
    path = REPO / "tools/checks/check_deepspeed_surface.py"
    if not path.exists():
        pytest.skip("needs the monorepo checkout (tools/)")
    spec = importlib.util.spec_from_file_location("check_deepspeed_surface", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _resolve(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_recorded_name_is_provided_not_available_or_listed_and_the_docs_are_current(capsys):
    """CI's surface check: a name that is none of provided / not available / absent / differs / pending fails,
    so does a stale table entry, so does a docs/deepspeed-api.md that the table no longer produces."""
    tool = _tool()
    code = tool.main(["--check"])
    out = capsys.readouterr().out
    assert code == 0, out


def test_the_check_fails_on_a_gap_and_on_a_stale_entry(monkeypatch):
    """The check can fail: drop a table entry (a gap appears) and list a provided name (stale)."""
    tool = _tool()
    real = tool._table()
    absent = dict(real.ABSENT)
    absent.pop("deepspeed.ops.gds")
    absent["deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer.step"] = "stale on purpose"
    table = types.SimpleNamespace(
        ABSENT=absent,
        DIFFERS=real.DIFFERS,
        MACHINE_DEPENDENT=real.MACHINE_DEPENDENT,
        NOT_CALLED=real.NOT_CALLED,
    )
    monkeypatch.setattr(tool, "_table", lambda: table)
    failures = tool.check().failures
    assert any(f.startswith("deepspeed.ops.gds.") for f in failures), failures[:5]
    assert any(
        "stale ABSENT entry 'deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer.step'" in f
        for f in failures
    )


def test_the_check_fails_on_a_provided_function_no_test_calls(tmp_path, monkeypatch):
    """Every provided function and class is recorded as called by a test (tools/checks/record_surface_calls.py)
    or listed with a reason in NOT_CALLED; stale entries in either fail too. Constants are not called."""
    tool = _tool()
    kinds = {"f": "function", "g": "function", "C": "class", "K": "constant", "h": "function"}
    record = {"modules": {"m": {"names": {n: {"kind": k} for n, k in kinds.items()}}}}
    statuses = {"f": "provided", "g": "provided", "C": "differs", "K": "provided", "h": "not available"}
    result = tool.Result(items=[tool.Item(f"m.{n}", "m", status) for n, status in statuses.items()])
    calls = tmp_path / "calls.json"
    calls.write_text(json.dumps({"called": {"m.f": "a test", "m.gone": "a test"}}))
    monkeypatch.setattr(tool, "CALLS", calls)
    monkeypatch.setattr(
        tool, "_table", lambda: types.SimpleNamespace(NOT_CALLED={"m.C": "why", "m.f": "old"})
    )
    failures = tool.uncalled(record, result)
    assert len(failures) == 3, failures
    assert failures[0].startswith("m.g: provided, but no test is recorded calling it")
    assert failures[1].startswith("NOT_CALLED entry 'm.f': a test calls it now")
    assert "m.gone is no longer a provided function or class" in failures[2]


def test_signature_comparison():
    tool = _tool()
    theirs = [["a", "pk"], ["b", "pk", "1"], ["c", "k", "None"]]
    assert (
        tool.compare_signatures(theirs, [["a", "pk"], ["b", "pk", "2"], ["c", "k", "0"], ["d", "k", "0"]])
        is None
    )
    assert "position 1" in tool.compare_signatures(theirs, [["a", "pk"], ["x", "pk", "1"], ["c", "k", "0"]])
    assert "has no default" in tool.compare_signatures(theirs, [["a", "pk"], ["b", "pk"], ["c", "k", "0"]])
    assert "keyword 'c' missing" in tool.compare_signatures(theirs, [["a", "pk"], ["b", "pk", "1"]])
    assert tool.compare_signatures(theirs, [["a", "pk"], ["b", "pk", "1"], ["kw", "**"]]) is None
    assert "extra required 'e'" in tool.compare_signatures([["a", "pk"]], [["a", "pk"], ["e", "pk"]])


@pytest.mark.parametrize(
    "call", BEHAVIOUR["calls"], ids=lambda c: f"{c['path'].rsplit('.', 1)[1]}{c['args']}"
)
def test_calls_answer_as_deepspeeds(call):
    """checkpoint.utils' file names, utils.numa's range parsing, utils.torch's version check: DeepSpeed's
    return value (or exception class) for the same arguments."""
    fn = _resolve(call["path"])
    if "raised" in call:
        with pytest.raises(Exception) as info:  # noqa: PT011 - the class is compared by name below
            fn(*call["args"])
        assert type(info.value).__name__ == call["raised"] or call["raised"] in [
            c.__name__ for c in type(info.value).__mro__
        ]
    else:
        got = fn(*call["args"])
        assert (list(got) if isinstance(got, range) else got) == call["returned"]


# ds spells DeepSpeed's data_types.grad_accum_dtype as bf16.grad_accum_dtype (ds_config rejects data_types)
_DS_SPELLING = {"data_types": lambda extra: {"bf16": {**extra["bf16"], "grad_accum_dtype": "fp32"}}}
# where ds's answer differs from DeepSpeed's, and why
_KNOWN = {
    ("bf16.zero1.fp32_accum", "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer"): (
        "DeepSpeed builds BF16_Optimizer here; ds builds its ZeroOptimizer, the class DeepSpeedZeroOptimizer is"
    ),
}


@pytest.mark.parametrize("name", list(BEHAVIOUR["engines"]["configs"]))
def test_isinstance_of_deepspeeds_optimizer_classes_holds_where_it_does_in_deepspeed(name):
    """Which of DeepSpeed's optimizer classes ``isinstance(engine.optimizer, cls)`` holds for, per configuration
    (client torch AdamW, a world of 1), as DeepSpeed 0.19.8 answered."""
    extra = dict(BEHAVIOUR["engines"]["configs"][name])
    if "data_types" in extra:
        extra = {k: v for k, v in extra.items() if k != "data_types"} | _DS_SPELLING["data_types"](extra)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if extra.get("bf16", {}).get("enabled") else torch.float32
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).to(dtype)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True, **extra}
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=config
    )
    for path, expected in BEHAVIOUR["engines"]["isinstance"][name].items():
        got = isinstance(engine.optimizer, _resolve(path))
        if (name, path) in _KNOWN:
            assert got != expected, f"{name}: {path} now agrees with DeepSpeed; drop it from _KNOWN"
        else:
            assert got == expected, (
                f"{name}: isinstance(engine.optimizer, {path}) is {got}, DeepSpeed's {expected}"
            )


def test_zero_optimizer_classes_are_ds_classes_themselves():
    import ds_zero
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    assert DeepSpeedZeroOptimizer is ds_zero.ZeroOptimizer
    assert DeepSpeedZeroOptimizer_Stage3 is ds_zero.ZeroStage3Optimizer


def test_optimizer_views_cannot_be_constructed_directly():
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    with pytest.raises(deepspeed.FeatureNotAvailableError, match="BF16_Optimizer directly"):
        BF16_Optimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1))


def test_not_available_names_raise_naming_their_feature():
    from deepspeed.comm import log_summary
    from deepspeed.runtime.sparse_tensor import SparseTensor
    from deepspeed.utils.numa import get_numactl_cmd

    for obj in (SparseTensor, log_summary, get_numactl_cmd):
        with pytest.raises(deepspeed.FeatureNotAvailableError, match=obj.__ds_missing__.split(" (")[0]):
            obj()


def test_non_reentrant_checkpoint_recomputes_with_inputs_that_need_no_grad():
    """DeepSpeed added non_reentrant_checkpoint for this case: gradients reach the parameters although no input
    requires grad."""
    from deepspeed.runtime.activation_checkpointing.checkpointing import non_reentrant_checkpoint

    layer = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    non_reentrant_checkpoint(layer, x).sum().backward()
    expected = torch.ones(4, 2).T @ x
    torch.testing.assert_close(layer.weight.grad, expected)


def test_compatible_ops_answer_for_ds():
    from deepspeed.ops.op_builder import ALL_OPS

    ops = deepspeed.ops.__compatible_ops__
    assert set(ops) >= {b.NAME for b in ALL_OPS.values()}
    assert ops["cpu_adam"] and ops["async_io"] and not ops["gds"]


def test_see_memory_usage_prints_only_when_forced(capsys):
    """DeepSpeed's examples call it around steps; DeepSpeed prints nothing without force=True."""
    from deepspeed.runtime.utils import see_memory_usage

    see_memory_usage("quiet")
    assert capsys.readouterr().out == ""
    see_memory_usage("after step", force=True)
    out = capsys.readouterr().out
    assert out.startswith("after step\nMA ") and "CPU Virtual Memory:  used = " in out


def _only_raises(x=None):
    """A docstring does not count."""
    raise NotImplementedError("never works")


class _RaisesOnConstruction:
    def __init__(self, *args):
        raise NotImplementedError("never works")


def _works(x=None):
    if x:
        raise NotImplementedError("only for a true x")
    return 1


def test_a_name_whose_every_use_raises_is_not_counted_as_provided():
    tool = _tool()
    assert tool.always_raises(_only_raises) and tool.always_raises(_RaisesOnConstruction)
    assert not tool.always_raises(_works) and not tool.always_raises(deepspeed.comm.get_rank)
    # the names of this kind that ds has are marked not available, and the check calls them to confirm it
    for name in (deepspeed.comm.log_summary, deepspeed.launcher.launcher_helper.main,
                 deepspeed.launcher.multinode_runner.IMPIRunner, deepspeed.ops.op_builder.CPUAdamBuilder.load):  # fmt: skip
        assert tool.not_available(name), name


def _raises_as_deepspeed_does():
    raise RuntimeError("DeepSpeed raises this here too")


def test_raising_what_deepspeed_raises_stays_provided():
    assert not _tool().always_raises(_raises_as_deepspeed_does)
