"""DeepSpeed's per-key engine getters on ds's engine return what DeepSpeed 0.19.8's return.

The values are recorded from DeepSpeed by tools/fixtures/make_deepspeed_getter_fixtures.py on the same configs
(fixtures/deepspeed_engine_getters.json); ds's engine is built here with ``deepspeed.initialize`` on each.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import deepspeed
import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_engine_getters.json").read_text())
_spec = importlib.util.spec_from_file_location(
    "getter_rec", ROOT / "tools/fixtures/make_deepspeed_getter_fixtures.py"
)
REC = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(REC)

# (config, getter) -> why ds's value legitimately differs from the recorded one
DIFFERS = {
    # DeepSpeed 0.19.8 returns its three bound getters, not their values (a bug): ds returns the values
    **{(c, "get_batch_info"): "values, not bound methods" for c in REC.CONFIGS},
    # DeepSpeed's groups are set up only with an mpu or MoE and its getters assert: ds is data-parallel
    # only, its groups always answer (data-parallel rank = the rank, model/tensor-parallel rank 0)
    **{
        (c, g): "ranks answered"
        for c in REC.CONFIGS
        for g in ("get_data_parallel_rank", "get_model_parallel_rank", "get_tensor_parallel_rank")
    },
    # without an fp16 section ds keeps its own initial_scale_power, 32 (docs/design.md §2; the deepspeed
    # package fills 16 only into an fp16 section, docs/deepspeed-api.md "Defaults that differ"): fp16 is off
    ("zero2_bf16_offload", "initial_dynamic_scale"): "2**32 with fp16 off",
    ("zero2_bf16_offload", "dynamic_loss_scale_args"): "init_scale 2**32 with fp16 off",
}
# keys inside a recorded section whose default differs (docs/deepspeed-api.md "Defaults that differ")
SECTION_DEFAULTS = {
    # DeepSpeed 0.19.8's OffloadParamConfig defaults pin_memory to True, ds-config's to False
    ("zero3_bf16", "zero_offload_param"): {"pin_memory": False},
}
EXPECTED_DS = {
    "get_batch_info": {"zero3_bf16": [8, 4, 2], "zero2_bf16_offload": [6, 2, 3]},
    "get_data_parallel_rank": 0,
    "get_model_parallel_rank": 0,
    "get_tensor_parallel_rank": 0,
}


def _jsonable(value):
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, tuple):
        return list(value)
    return value


def _engine(name):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    config = json.loads(json.dumps(REC.CONFIGS[name]))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


@pytest.mark.parametrize("name", list(REC.CONFIGS))
def test_getters_return_deepspeed_019s_values(name):
    engine = _engine(name)
    recorded = RECORD[name]
    for getter in REC.GETTERS:
        got = _jsonable(getattr(engine, getter)())
        if (name, getter) in DIFFERS:
            if getter in EXPECTED_DS:
                want = EXPECTED_DS[getter]
                assert got == (want[name] if isinstance(want, dict) else want), getter
            continue
        want = recorded[getter]
        if (name, getter) in SECTION_DEFAULTS:
            want = {**want, **SECTION_DEFAULTS[name, getter]}
        if isinstance(want, dict) and isinstance(got, dict):
            # ds's sections may carry more keys (aio's thread_count): DeepSpeed's keys must agree
            got = {k: got.get(k) for k in want}
        assert got == want, f"{name}: {getter}() is {got!r}, DeepSpeed 0.19.8 returns {want!r}"


@pytest.mark.parametrize("name", list(REC.CONFIGS))
def test_set_train_micro_batch_size_keeps_accumulation(name):
    """DeepSpeed changes the micro batch and the train batch, keeping gradient accumulation."""
    engine = _engine(name)
    engine.set_train_micro_batch_size(3)
    got = [
        engine.train_batch_size(),
        engine.train_micro_batch_size_per_gpu(),
        engine.gradient_accumulation_steps(),
    ]
    assert got == RECORD[name]["batch after set_train_micro_batch_size(3)"]
    assert list(engine.get_batch_info()) == got


@pytest.mark.parametrize("getter", ["is_map_style_dataset", "is_iterable_style_dataset"])
def test_dataset_kind(getter):
    class MapData(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return i

    class IterData(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(2))

    fn = getattr(deepspeed.DeepSpeedEngine, getter)
    got = {kind: fn(obj) for kind, obj in (("list", [1, 2]), ("map", MapData()), ("iterable", IterData()))}
    assert got == RECORD[getter]
