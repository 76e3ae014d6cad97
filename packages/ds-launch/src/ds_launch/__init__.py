"""The ds-launch CLI, rank discovery under mpirun (mpi4py), hostfiles, clean failure."""

__version__ = "0.1.0"
__all__ = ["__version__"]
