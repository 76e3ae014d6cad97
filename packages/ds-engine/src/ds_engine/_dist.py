"""``init_distributed`` with DeepSpeed's signature, on top of ds_launch."""

from __future__ import annotations

from datetime import timedelta

import ds_launch


def init_distributed(
    dist_backend: str | None = None,
    auto_mpi_discovery: bool = True,
    distributed_port: int = 29500,
    verbose: bool = True,
    timeout: timedelta = timedelta(minutes=30),
    init_method: str | None = None,
    **_ignored: object,
) -> ds_launch.Topology:
    """DeepSpeed's ``deepspeed.init_distributed``: join the job however it was launched; returns the topology.

    ``verbose`` and DeepSpeed's later keyword arguments (``rank``, ``world_size``, ...) are accepted
    so scripts run unchanged; ranks always come from the launcher (ds_launch.init_distributed).
    """
    return ds_launch.init_distributed(
        backend=dist_backend,
        timeout=timeout,
        distributed_port=distributed_port,
        auto_mpi_discovery=auto_mpi_discovery,
        init_method=init_method,
    )
