"""Numba CPU kernels for the bf16 step: each reads or writes the gradients and weights only once.

Imported lazily (``numba`` is the optional ``ds-precision[fast]`` extra); the optimizer falls back to
torch ops without it. bf16 is the top half of an fp32, so widening is a 16-bit shift and a bit cast;
the results are bit-identical to torch's: ``float32(g) * float32(inv)`` for the scaled gradient copy,
and round-to-nearest-even with every NaN written as ``0xFFFF`` for the fp32 -> bf16 copy-back (what
torch's CPU conversion writes). Only the sum of squares differs from torch, by summation order.

Tensors arrive as raw addresses with a table of fixed-size chunks, so one parallel launch covers a
whole list of tensors of any sizes; the chunks are fixed, so the result does not depend on the
thread count.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["copy_scaled_to_fp32", "copy_to_bf16", "sum_of_squares"]

CHUNK_ELEMS = 1 << 16  # 128 KiB of bf16 + 256 KiB of fp32: stays in L2 while a thread works on it


@intrinsic
def _bits_to_f32(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@intrinsic
def _f32_to_bits(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _u16_ptr(typingctx, addr):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(16).as_pointer())

    return types.CPointer(types.uint16)(types.int64), codegen


@intrinsic
def _f32_ptr(typingctx, addr):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.FloatType().as_pointer())

    return types.CPointer(types.float32)(types.int64), codegen


def _jit(**options):
    """``numba.njit`` with an on-disk cache, or without one where no cache directory is writable."""

    def decorate(fn):
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # numba: "cannot cache function ...: no locator available"
            return numba.njit(**options)(fn)

    return decorate


@_jit()
def _chunk_table(numels: np.ndarray) -> np.ndarray:
    """(tensor index, start element) of every chunk, in order."""
    count = 0
    for n in numels:
        count += (n + CHUNK_ELEMS - 1) // CHUNK_ELEMS
    table = np.empty((count, 2), dtype=np.int64)
    k = 0
    for i in range(numels.size):
        for start in range(0, numels[i], CHUNK_ELEMS):
            table[k, 0] = i
            table[k, 1] = start
            k += 1
    return table


# reassociation lets LLVM vectorise the reduction; no nnan/ninf, so inf/nan still propagate
@_jit(fastmath={"reassoc", "contract"})
def _chunk_sum_of_squares(src: np.ndarray) -> float:
    acc = 0.0
    for j in range(src.size):
        x = np.float64(_bits_to_f32(np.uint32(src[j]) << np.uint32(16)))
        acc += x * x
    return acc


@_jit()
def _chunk_copy_scaled(src: np.ndarray, dst: np.ndarray, inv: np.float32) -> None:
    for j in range(src.size):
        dst[j] = _bits_to_f32(np.uint32(src[j]) << np.uint32(16)) * inv


@_jit()
def _chunk_round_to_bf16(src: np.ndarray, dst: np.ndarray) -> None:
    for j in range(src.size):
        bits = _f32_to_bits(src[j])
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        dst[j] = np.uint16(0xFFFF) if nan else np.uint16(rounded)


# the per-chunk loops live in their own functions: inside a prange body LLVM did not vectorise them
@_jit(parallel=True)
def _sum_of_squares(addrs: np.ndarray, numels: np.ndarray, table: np.ndarray) -> float:
    partial = np.zeros(table.shape[0], dtype=np.float64)
    for k in numba.prange(table.shape[0]):
        i, start = table[k, 0], table[k, 1]
        stop = min(start + CHUNK_ELEMS, numels[i])
        partial[k] = _chunk_sum_of_squares(numba.carray(_u16_ptr(addrs[i]), numels[i])[start:stop])
    return partial.sum()


@_jit(parallel=True)
def _copy_scaled(
    src_addrs: np.ndarray, dst_addrs: np.ndarray, numels: np.ndarray, table: np.ndarray, inv: np.float32
) -> None:
    for k in numba.prange(table.shape[0]):
        i, start = table[k, 0], table[k, 1]
        stop = min(start + CHUNK_ELEMS, numels[i])
        src = numba.carray(_u16_ptr(src_addrs[i]), numels[i])
        dst = numba.carray(_f32_ptr(dst_addrs[i]), numels[i])
        _chunk_copy_scaled(src[start:stop], dst[start:stop], inv)


@_jit(parallel=True)
def _round_to_bf16(src: np.ndarray, dst: np.ndarray) -> None:
    n = src.size
    for k in numba.prange((n + CHUNK_ELEMS - 1) // CHUNK_ELEMS):
        start, stop = k * CHUNK_ELEMS, min((k + 1) * CHUNK_ELEMS, n)
        _chunk_round_to_bf16(src[start:stop], dst[start:stop])


def _launch_args(tensors: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    addrs = np.array([t.data_ptr() for t in tensors], dtype=np.int64)
    numels = np.array([t.numel() for t in tensors], dtype=np.int64)
    return addrs, numels, _chunk_table(numels)


def _match_torch_threads() -> None:
    numba.set_num_threads(min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))


def sum_of_squares(grads: list[torch.Tensor]) -> float:
    """Sum of squares of contiguous CPU bf16 tensors, accumulated in fp64 (inf/nan propagate)."""
    if not grads:
        return 0.0
    _match_torch_threads()
    addrs, numels, table = _launch_args(grads)
    return float(_sum_of_squares(addrs, numels, table))


def copy_scaled_to_fp32(dst: list[torch.Tensor], src: list[torch.Tensor], inv: float) -> None:
    """``dst[i] = src[i].float() * inv`` (contiguous CPU: bf16 ``src``, fp32 ``dst``) in one pass."""
    if not src:
        return
    _match_torch_threads()
    src_addrs, numels, table = _launch_args(src)
    dst_addrs = np.array([t.data_ptr() for t in dst], dtype=np.int64)
    _copy_scaled(src_addrs, dst_addrs, numels, table, np.float32(inv))


def copy_to_bf16(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for a contiguous 1-D fp32 ``src`` and bf16 ``dst`` (bit-identical to torch)."""
    _match_torch_threads()
    _round_to_bf16(src.detach().numpy(), dst.detach().view(torch.int16).numpy().view(np.uint16))
