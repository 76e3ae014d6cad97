"""Run under mpirun: OneBitAdam through mpi4py must match the exact mean closely and agree on every rank."""

import json
import sys

import torch
from ds_optim import OneBitAdam
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()
gen = torch.Generator().manual_seed(rank)
inputs = [torch.randn(33, 7, generator=gen), torch.randn(3, generator=gen)]
opt = OneBitAdam([torch.nn.Parameter(torch.zeros_like(x)) for x in inputs], comm_backend_name="mpi")
total = [torch.zeros_like(x) for x in inputs]
for _ in range(200):
    buf = [x.clone() for x in inputs]
    opt._compressed_allreduce(0, buf)
    for t, b in zip(total, buf):
        t += b
mean = [torch.from_numpy(comm.allreduce(x.numpy())) / world for x in inputs]
err = max(float((t / 200 - m).abs().max() / m.abs().max()) for t, m in zip(total, mean))
lasts = comm.gather([b.tolist() for b in buf])
if rank == 0:
    json.dump(
        {"err": err, "same": all(x == lasts[0] for x in lasts), "bytes": opt.last_step_bytes_sent}, sys.stdout
    )
