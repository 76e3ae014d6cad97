"""Run under mpirun (one process per rank): ds-zero's parity configurations and stage 3's parity check,
with ranks from mpi4py as ds_launch finds them, so the collectives qualify for MPI (``ds_zero._mpi``).

Prints, on rank 0, one JSON line: per configuration and rank the weight difference from single-process
training, a digest of the trained weights and how many MPI collectives ran; the same for stage 3.
``DS_ZERO_COLLECTIVES=torch`` in the environment runs ``_parity.BASELINE`` over torch.distributed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mpi4py import MPI  # imported before torch.distributed, as ds_launch's discovery does under mpirun

comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK=str(rank), WORLD_SIZE=str(world))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _parity  # noqa: E402
from ds_zero import mpi_collective_calls  # noqa: E402

torch.set_num_threads(1)
dist.init_process_group("gloo", rank=rank, world_size=world)


baseline = os.environ.get("DS_ZERO_COLLECTIVES") == "torch"  # the baseline's configurations only
out = _parity.run_all(rank, world, mpi_collective_calls, baseline=baseline)
gathered = comm.gather(out)
if rank == 0:
    print(json.dumps(gathered), flush=True)
dist.destroy_process_group()
comm.Barrier()
MPI.Finalize()
# gloo's threads drop their last references to a finished work's tensors after wait() has returned; when
# that lands during interpreter shutdown, torch aborts ("terminate called without an active exception",
# seen here once in ten runs, over torch.distributed alone). The results are out: skip the teardown.
os._exit(0)
