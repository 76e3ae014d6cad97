"""``init_distributed`` with DeepSpeed's signature, on top of ds_launch."""

from __future__ import annotations

from datetime import timedelta

import ds_launch
import torch.distributed


def init_distributed(
    dist_backend: str | None = None,
    auto_mpi_discovery: bool = True,
    distributed_port: int = 29500,
    verbose: bool = True,
    timeout: timedelta = timedelta(minutes=30),
    init_method: str | None = None,
    dist_init_required: bool | None = None,
    **_ignored: object,
) -> ds_launch.Topology:
    """DeepSpeed's ``deepspeed.init_distributed``: join the job however it was launched; returns the topology.

    ``verbose`` and DeepSpeed's later keyword arguments (``rank``, ``world_size``, ...) are accepted
    so scripts run unchanged; ranks always come from the launcher (ds_launch.init_distributed).
    ``dist_init_required=False`` with no process group raises DeepSpeed's AssertionError at once (the caller
    said it made one), rather than joining or waiting for a job.
    """
    if dist_init_required is False and not torch.distributed.is_initialized():
        raise AssertionError(
            "Distributed backend is not initialized. Please set dist_init_required to True or initialize "
            "before calling deepspeed.initialize()"
        )
    return ds_launch.init_distributed(
        backend=dist_backend,
        timeout=timeout,
        distributed_port=distributed_port,
        auto_mpi_discovery=auto_mpi_discovery,
        init_method=init_method,
    )
