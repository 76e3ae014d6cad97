"""DeepSpeed's ``deepspeed.launcher.constants``: the launcher names the ``deepspeed`` command accepts.

pdsh, openmpi and slurm run through ds-launch (its pdsh/ssh, mpi and slurm launchers); mpich, impi and mvapich are
known names that fail with ``FeatureNotAvailableError`` (``deepspeed.launcher.multinode_runner``).
"""

PDSH_LAUNCHER = "pdsh"
PDSH_MAX_FAN_OUT = 1024

OPENMPI_LAUNCHER = "openmpi"
MPICH_LAUNCHER = "mpich"
IMPI_LAUNCHER = "impi"
SLURM_LAUNCHER = "slurm"
MVAPICH_LAUNCHER = "mvapich"
MVAPICH_TMP_HOSTFILE = "/tmp/deepspeed_mvapich_hostfile"

__all__ = [
    "PDSH_LAUNCHER",
    "PDSH_MAX_FAN_OUT",
    "OPENMPI_LAUNCHER",
    "MPICH_LAUNCHER",
    "IMPI_LAUNCHER",
    "SLURM_LAUNCHER",
    "MVAPICH_LAUNCHER",
    "MVAPICH_TMP_HOSTFILE",
]
