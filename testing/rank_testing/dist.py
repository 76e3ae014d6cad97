"""Run a function on N real processes joined by torch.distributed (gloo on CPU)."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_module
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(fn, rank, world_size, port, backend, args, queue, env):
    # the parent's environment as it is now (a forkserver child starts with the server's, from its start)
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        # plain pickle: tensors travel as bytes, not as shared memory that dies with this process
        queue.put((rank, True, pickle.dumps(result)))
    except BaseException:  # report every failure, including KeyboardInterrupt, to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _context() -> mp.context.BaseContext:
    """Fresh processes forked from a server that has imported torch once (``forkserver``): each rank skips
    torch's import (seconds of CPU a rank, most of a small multi-rank test), and, unlike ``fork``, no rank
    inherits the test process's threads or state. ``DS_TEST_START=spawn`` starts each rank from scratch."""
    method = os.environ.get("DS_TEST_START", "forkserver")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo"])
    return ctx


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 180.0,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` fresh processes; return results by rank.

    ``fn`` must be importable (module level). Raises ``RuntimeError`` with every failing rank's
    traceback, or when a rank neither returns nor fails within ``timeout_s``.
    """
    ctx = _context()
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, r, world_size, port, backend, args, queue, {**os.environ, **(env or {})}),
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            try:
                rank, ok, payload = queue.get(timeout=timeout_s)
            except queue_module.Empty:  # a rank hung or died without reporting
                dead = [f"rank {r} exit code {p.exitcode}" for r, p in enumerate(procs) if r not in results]
                raise RuntimeError(f"ranks did not report within {timeout_s}s: {', '.join(dead)}") from None
            if ok:
                results[rank] = pickle.loads(payload)
            else:
                errors.append(f"--- rank {rank} ---\n{payload}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RuntimeError("distributed test failed:\n" + "\n".join(errors))
    return [results[r] for r in range(world_size)]
