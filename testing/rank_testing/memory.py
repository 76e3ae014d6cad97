"""Memory observed inside a test process: the bytes of live tensor storages (walked, never computed)."""

from __future__ import annotations

import gc

import torch


def live_storage_bytes() -> int:
    """Bytes of every distinct CPU tensor storage alive in this process (a gc walk; views of one storage, or a
    parameter and the flat buffer it points into, count once).

    tools/_bench_memory.py's ``live_tensor_bytes`` walks further (module grads, optimizer state, DTensor
    shards) for the benchmarks, and runs in DeepSpeed's venv too; the tests keep to this one.
    """
    gc.collect()
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        # type(), not isinstance: isinstance reads __class__, which warns on torch's deprecated aliases
        if issubclass(type(obj), torch.Tensor) and obj.device.type == "cpu":
            st = obj.untyped_storage()
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
    return sum(seen.values())
