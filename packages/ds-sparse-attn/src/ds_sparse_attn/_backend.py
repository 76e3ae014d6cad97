"""Which path computes SparseSelfAttention, per device and dtype, and the one log line that says so.

* 'auto' on CUDA: FlexAttention (fused Triton kernels, tensor cores) when it compiles for this device, dtype,
  head dim and BlockMask tile, else the Numba kernels when numba-cuda is installed, else the torch path.
* 'auto' on CPU: the torch path (torch's fused CPU flash kernel over groups of rows). Chosen by measurement:
  `kernels/bench_sparse_attn.py --quick` on this project's 2-core CPU machine (docs/benchmarks.md) has it
  faster than compiled FlexAttention, and torch's FlexAttention has no CPU backward.
* A forced path (constructor `backend=`, or the DS_SPARSE_ATTN_BACKEND environment variable when the
  constructor says 'auto') is used; 'flex' that cannot run falls back to the next path with one warning
  line that says why (same result, other speed); 'numba' that cannot run is an error.
"""

from __future__ import annotations

import logging

import torch
from ds_config import env_choice

from . import _cuda_kernels, _flex_attention

BACKENDS = ("auto", "torch", "torch-gather", "numba", "flex")
ENV_VAR = "DS_SPARSE_ATTN_BACKEND"

logger = logging.getLogger("ds_sparse_attn")

_FLEX_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (device, dtype, head dim, block, tile) -> None (FlexAttention compiled and ran) or why not; per process
_flex_probes: dict[tuple[str, torch.dtype, int, int, int], str | None] = {}
_logged: set[tuple[str, ...]] = set()


def requested(backend: str) -> str:
    """The constructor's backend, or DS_SPARSE_ATTN_BACKEND when the constructor left it at 'auto'."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
    if backend != "auto":
        return backend
    return env_choice(ENV_VAR, BACKENDS, "auto")


def _say(level: int, *parts: str) -> None:
    if parts not in _logged:
        _logged.add(parts)
        logger.log(level, "ds_sparse_attn: " + " ".join(parts))


def flex_problem(query: torch.Tensor, block: int, num_blocks: int, needs_grad: bool) -> str | None:
    """Why FlexAttention cannot compute this call, or None when it can (probed once per configuration)."""
    if query.dtype not in _FLEX_DTYPES:
        return f"FlexAttention does not take {query.dtype}"
    if query.device.type == "cpu" and needs_grad:
        return f"torch {torch.__version__} has no FlexAttention backward on CPU"
    if query.device.type not in ("cpu", "cuda"):
        return f"FlexAttention is not used on {query.device.type}"
    tile = _flex_attention.tile_size(block, num_blocks, query.device)
    key = (str(query.device), query.dtype, query.shape[-1], block, tile)
    if key not in _flex_probes:
        _flex_probes[key] = _flex_attention.probe(query.device, query.dtype, query.shape[-1], block, tile)
    return _flex_probes[key]


def _numba_usable(query: torch.Tensor) -> bool:
    on_device = query.is_cuda or _cuda_kernels.simulator_enabled()
    return on_device and _cuda_kernels.numba_cuda_available()


def choose(backend: str, query: torch.Tensor, block: int, needs_grad: bool) -> str:
    """The path ('flex', 'numba', 'torch' or 'torch-gather') for this call; logs the choice once."""
    where = f"{query.device.type} {str(query.dtype).removeprefix('torch.')}:"
    num_blocks = query.shape[2] // block
    if backend in ("torch", "torch-gather"):
        _say(logging.INFO, where, backend, "(forced)")
        return backend
    if backend == "numba":
        if not _numba_usable(query):
            if query.is_cuda or _cuda_kernels.simulator_enabled():
                raise ImportError(f"backend='numba' needs numba-cuda: {_cuda_kernels.PIP_INSTALL}")
            raise RuntimeError("backend='numba' needs CUDA tensors (or NUMBA_ENABLE_CUDASIM=1 for tests).")
        _say(logging.INFO, where, "numba (forced)")
        return "numba"
    fallback = "numba" if query.is_cuda and _numba_usable(query) else "torch"
    if backend == "flex" or query.is_cuda:  # forced, or auto on CUDA: FlexAttention where it compiles
        how = "forced" if backend == "flex" else "auto: FlexAttention compiled"
        problem = flex_problem(query, block, num_blocks, needs_grad)
        if problem is None:
            _say(logging.INFO, where, f"flex ({how})")
            return "flex"
        said = (
            f"backend 'flex' falls back to {fallback}"
            if backend == "flex"
            else f"auto uses {fallback}, not FlexAttention"
        )
        _say(logging.WARNING, where, f"{said}: {problem}")
        return fallback
    _say(logging.INFO, where, "torch (auto: measured fastest on CPU)")
    return "torch"
