"""Record what DeepSpeed 0.19.8's per-key engine getters return, for ds's engine to be compared with.

Run from the repository root with the real DeepSpeed (CPU accelerator, one process):

    env -u PYTHONPATH DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=/tmp/te_getters \
        /work/refenv/bin/python tools/make_deepspeed_getter_fixtures.py

Writes ``packages/deepspeed/tests/fixtures/deepspeed_engine_getters.json``: for each config in ``CONFIGS``
(also read by ``packages/deepspeed/tests/test_engine_key_getters.py``) the value each getter in ``GETTERS``
returns on an engine built with a small model. Non-JSON values are recorded as JSON: a pydantic section
(``zero_offload_param``) as its ``model_dump(mode="json")``, a tuple as a list, a bound method as
``{"bound method": name}``, a getter that raises as ``{"raises": class name, "message": text}``. Also recorded:
the batch sizes after ``set_train_micro_batch_size(3)``, and ``is_map_style_dataset`` /
``is_iterable_style_dataset`` of a list, a map-style and an iterable-style dataset.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "packages/deepspeed/tests/fixtures/deepspeed_engine_getters.json"

GETTERS = (
    "zero_sub_group_size is_first_weights_partition_group zero_prefetch_bucket_size zero_max_live_parameters zero_max_reuse_distance "
    "zero_param_persistence_threshold zero_model_persistence_threshold zero_allgather_partitions "
    "zero_round_robin_gradients zero_load_from_fp32_weights zero_elastic_checkpoint "
    "zero_ignore_unused_parameters zero_offload_param zero_use_cpu_optimizer zero_nvme_offload_optimizer "
    "zero_partial_offload zero_force_ds_cpu_optimizer aio_config initial_dynamic_scale "
    "dynamic_loss_scale_args fp16_auto_cast fp16_master_weights_and_gradients "
    "bf16_master_weights_and_gradients bf16_optimizer_states dataloader_drop_last memory_breakdown "
    "get_batch_info get_data_parallel_rank get_model_parallel_rank get_tensor_parallel_rank"
).split()

CONFIGS = {
    # ZeRO 3 (bf16) with its stage-3 keys and the fp16 scaler's keys off their defaults (the fp16 section
    # is read though not enabled: DeepSpeed's CPU accelerator refuses fp16)
    "zero3_bf16": {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "bf16": {"enabled": True},
        "fp16": {
            "enabled": False,
            "initial_scale_power": 10,
            "loss_scale_window": 50,
            "hysteresis": 3,
            "min_loss_scale": 2,
            "consecutive_hysteresis": True,
        },
        "zero_optimization": {
            "stage": 3,
            "sub_group_size": 12345678,
            "stage3_prefetch_bucket_size": 1234567,
            "stage3_max_live_parameters": 2345678,
            "stage3_max_reuse_distance": 3456789,
            "stage3_param_persistence_threshold": 4567,
            "stage3_model_persistence_threshold": 56789,
            "allgather_partitions": False,
            "round_robin_gradients": True,
            "load_from_fp32_weights": False,
            "elastic_checkpoint": True,
            "ignore_unused_parameters": False,
            "offload_param": {"device": "cpu", "buffer_count": 7, "max_in_cpu": 123456789},
        },
        "dataloader_drop_last": True,
        "memory_breakdown": False,
    },
    # ZeRO 2 with bf16 and the optimizer state offloaded to the CPU
    "zero2_bf16_offload": {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 3,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        "zero_force_ds_cpu_optimizer": True,
        "aio": {"block_size": 262144, "queue_depth": 4, "single_submit": True},
    },
}


def _jsonable(value):
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if callable(value):  # DeepSpeed's get_batch_info returns its three bound getters, not their values
        return {"bound method": value.__name__}
    return value


def _call(getter):
    """The getter's value as JSON, or ``{"raises": class name, "message": ...}``."""
    try:
        return _jsonable(getter())
    except Exception as exc:  # noqa: BLE001 - what it raises is what is recorded
        return {"raises": type(exc).__name__, "message": str(exc)}


def main() -> None:
    import deepspeed
    import torch

    class MapData(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return i

    class IterData(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(2))

    out: dict = {"deepspeed": deepspeed.__version__}
    for name, config in CONFIGS.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        values = {getter: _call(getattr(engine, getter)) for getter in GETTERS}
        engine.set_train_micro_batch_size(3)
        values["batch after set_train_micro_batch_size(3)"] = [
            engine.train_batch_size(),
            engine.train_micro_batch_size_per_gpu(),
            engine.gradient_accumulation_steps(),
        ]
        out[name] = values
        engine.destroy()
    out["is_map_style_dataset"] = {
        kind: deepspeed.DeepSpeedEngine.is_map_style_dataset(obj)
        for kind, obj in (("list", [1, 2]), ("map", MapData()), ("iterable", IterData()))
    }
    out["is_iterable_style_dataset"] = {
        kind: deepspeed.DeepSpeedEngine.is_iterable_style_dataset(obj)
        for kind, obj in (("list", [1, 2]), ("map", MapData()), ("iterable", IterData()))
    }
    OUT.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main()
