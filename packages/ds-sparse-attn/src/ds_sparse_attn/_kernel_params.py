"""Compile-time constants of the Numba kernels, apart from the kernels so that the launchers
(_cuda_kernels) and the kernels (_numba_kernels) both read them without importing each other.

numba-cuda 0.30 needs a shared or local array's shape to be a module constant, not an expression written
inside the kernel.
"""

KEY_TILE = 16  # key (or query) rows staged in shared memory at a time
MAX_HEAD_DIM = 128  # per-thread row buffers (q, dO, accumulators) hold this many floats
MAX_BLOCK = 1024  # one thread per row of a layout block: a CUDA thread block holds at most 1024 threads
