"""One-pass CPU Adam with Numba: update fp32 weights and moments and write the bf16 copy in one loop.

Imported only when a step asks for a low-precision copy and numba is installed (``pip install
'ds-optim[fast]'``); numba compiles with its bundled LLVM on first use (cached on disk after that), so no
compiler is needed at install. Torch's two-pass path (fused Adam, then a copy) is the fallback.

The conversion is integer arithmetic on the fp32 bits, so it rounds exactly like torch's tensor
``.to(torch.bfloat16)`` on x86: round to nearest even, overflow to inf, and every NaN written as 0xFFFF as
torch's vectorised CPU cast writes it. An fp16 copy stays on the two-pass path: an exact branch-free
fp32->fp16 conversion (subnormals, NaN payload) in this loop was measured slower than torch's
fused-then-copy (120-150 vs 196-267 Mparam/s, 20M params, 2 threads), numba widening the integer lanes to
64 bits.
No fastmath: 'nnan'/'ninf' would let LLVM assume the weights are finite, and the loop is memory-bound and
vectorises without reassociation anyway.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

__all__ = ["adam_step_with_copy"]


@intrinsic
def _f32_bits(typingctx, x):
    """The bits of an fp32 value as uint32 (a register bitcast: reading them back through a uint32 view
    of the array just written is not ordered after the store, the arrays being marked non-aliasing)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@numba.njit(inline="always")
def _bf16_bits(u: np.uint32) -> np.uint16:
    """fp32 bits -> bf16 bits, round to nearest even; every NaN -> 0xFFFF as torch's vectorised cast."""
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.uint16(0xFFFF) if is_nan else np.uint16(rounded)


@numba.njit(parallel=True, cache=True)
def _adam_kernel(
    p, g, m, v, out, one_minus_beta1, beta2, one_minus_beta2, eps, decay, l2, step_size, bc2_sqrt
):
    """p, g, m, v: fp32 (n,); out: uint16 (n,) receiving the bf16 bits of the new p."""
    for i in numba.prange(p.shape[0]):
        grad = g[i] + l2 * p[i]
        mi = m[i] + one_minus_beta1 * (grad - m[i])
        vi = beta2 * v[i] + one_minus_beta2 * grad * grad
        m[i] = mi
        v[i] = vi
        pi = p[i] * decay - step_size * mi / (np.sqrt(vi) / bc2_sqrt + eps)
        p[i] = pi
        out[i] = _bf16_bits(_f32_bits(pi))


DTYPES = (torch.bfloat16,)


def _flat(x: torch.Tensor) -> np.ndarray:
    return x.detach().view(-1).numpy()


def adam_step_with_copy(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    lowp: torch.Tensor,
    *,
    step: float,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    adamw_mode: bool,
    bias_correction: bool,
) -> None:
    """One Adam/AdamW update of contiguous fp32 CPU tensors, writing ``lowp`` (bf16) in the same pass."""
    beta1, beta2 = betas
    # Per-step scalars in float64 and rounded once to fp32, as torch's fused kernel does.
    bc1 = 1.0 - beta1**step if bias_correction else 1.0
    bc2 = 1.0 - beta2**step if bias_correction else 1.0
    decay = 1.0 - lr * weight_decay if adamw_mode else 1.0
    l2 = 0.0 if adamw_mode else weight_decay
    f32 = np.float32
    numba.set_num_threads(min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    _adam_kernel(
        _flat(param),
        _flat(grad),
        _flat(exp_avg),
        _flat(exp_avg_sq),
        _flat(lowp.view(torch.int16)).view(np.uint16),
        f32(1.0 - beta1),
        f32(beta2),
        f32(1.0 - beta2),
        f32(eps),
        f32(decay),
        f32(l2),
        f32(lr / bc1),
        f32(bc2**0.5),
    )
