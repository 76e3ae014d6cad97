"""FlexAttention (torch.nn.attention.flex_attention, torch >= 2.5) over a layout's blocks.

The layout becomes a `BlockMask` whose tiles are `tile` tokens on a side, a multiple of the layout's block:
a tile whose layout blocks are all present is "full" (the kernel applies no mask in it), one with some
present is "partial" (the kernel evaluates `mask_mod`, the layout looked up per token, there), one with none
is skipped. With tile = the layout's block every present tile is full and the work is exactly the layout's.

Why tiles larger than the layout's block on CUDA: inductor's Triton kernels tile the sparse blocks with their
own BLOCK_M x BLOCK_N (e.g. 128 x 128 for bf16, head dim 64, on an H100/H200, torch 2.11-2.13), and refuse a
BlockMask whose block size is not a multiple of them ("Q and KV block size must be divisible by BLOCK_M and
BLOCK_N", an InductorError inside the flex_attention higher-order op): the reason the benchmark's
BLOCK_SIZE=64 mask did not compile on the H200. Tiles of 128 compile with the default kernel choices.

Masks and the relative position bias are one additive `score_mod` over captured tensors (their gradient,
for an rpe that requires one, is FlexAttention's). On CPU, torch compiles FlexAttention for inference only
and refuses inputs that require grad even in eager mode (torch 2.13): the CPU path is the torch one there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

from ._bias import ScoreBias

_CUDA_TILE = 128  # the BlockMask tile on CUDA: what the default Triton kernel choices divide


def unavailable_reason(device: torch.device) -> str | None:
    """Why FlexAttention cannot run compiled on this device, or None when it may (compiling may still fail)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention (needs torch >= 2.5)"
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed (torch.compile needs it for FlexAttention on CUDA)"
    return None


def tile_size(block: int, num_blocks: int, device: torch.device) -> int:
    """The BlockMask tile: the layout's block on CPU; on CUDA the largest multiple of it up to 128 that
    divides the sequence (the kernel's own tiles must divide it)."""
    if device.type != "cuda" or block >= _CUDA_TILE:
        return block
    factor = _CUDA_TILE // block
    while factor > 1 and num_blocks % factor:
        factor -= 1
    return block * factor


def kernel_options(tile: int) -> dict[str, int] | None:
    """Triton tile sizes that divide a BlockMask tile smaller than the defaults (None: the defaults)."""
    if tile >= _CUDA_TILE:
        return None
    return {name: tile for name in ("BLOCK_M", "BLOCK_N", "BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")}


def block_mask(layout: torch.Tensor, block: int, tile: int) -> Any:
    """The BlockMask of an (H, nb, nb) bool layout (H = 1 when shared by all heads) with `tile`-token tiles."""
    from torch.nn.attention.flex_attention import BlockMask

    heads, nb, _ = layout.shape
    factor = tile // block
    coarse = layout.view(heads, nb // factor, factor, nb // factor, factor)
    full = coarse.all(dim=(2, 4))
    partial = coarse.any(dim=(2, 4)) & ~full

    def indices(present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = present.sum(-1, dtype=torch.int32)
        # a stable sort of "absent" lists each row's present tiles first, ascending
        order = torch.argsort((~present).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[None].contiguous(), order[None].contiguous()

    fine = layout.contiguous()

    def layout_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return fine[h if heads > 1 else 0, q_idx // block, kv_idx // block]

    kv_num, kv_idx = indices(partial)
    full_num, full_idx = indices(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=tile, mask_mod=layout_mask)


def score_mod(bias: ScoreBias) -> Callable[..., Any] | None:
    """scale * q.k + rpe + key padding + attn mask as FlexAttention's score_mod (None when nothing is added)."""
    if bias.empty:
        return None
    rpe, key_padding, attn = bias.rpe, bias.key_padding, bias.attn
    rpe_batch = rpe is not None and rpe.shape[0] > 1
    rpe_heads = rpe is not None and rpe.shape[1] > 1

    def add_bias(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if rpe is not None:
            score = score + rpe[b if rpe_batch else 0, h if rpe_heads else 0, q_idx, kv_idx]
        if key_padding is not None:
            score = score + key_padding[b, kv_idx]
        if attn is not None:
            score = score + attn[q_idx, kv_idx]
        return score

    return add_bias


@cache
def compiled() -> Callable[..., Any]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Any,
    bias: ScoreBias,
    scale: float,
    options: dict[str, int] | None,
) -> torch.Tensor:
    """softmax(scale * q k^T + bias) v over the BlockMask; rows with nothing to attend give zeros (as the CPU
    path: FlexAttention's own result for a fully masked row is already 0). The bias stays in its own dtype
    (fp32 for half inputs), added to FlexAttention's fp32 scores."""
    return compiled()(
        q, k, v, score_mod=score_mod(bias), block_mask=mask, scale=scale, kernel_options=options
    )


def probe(device: torch.device, dtype: torch.dtype, dim: int, block: int, tile: int) -> str | None:
    """Compile and run FlexAttention forward and backward once on a tiny input with this device, dtype, head
    dim and tile; None when it worked, else the one-line reason."""
    reason = unavailable_reason(device)
    if reason is not None:
        return reason
    nb = 2 * (tile // block)
    layout = torch.ones(1, nb, nb, dtype=torch.bool, device=device)
    mask = block_mask(layout, block, tile)
    needs_grad = device.type != "cpu"
    q, k, v = (
        torch.randn(1, 1, nb * block, dim, device=device, dtype=dtype, requires_grad=needs_grad)
        for _ in range(3)
    )
    try:
        out = attend(q, k, v, mask, ScoreBias(), 1 / math.sqrt(dim), kernel_options(tile))
        if needs_grad:
            out.sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - any compile failure means: use another path, say why
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"torch.compile(flex_attention) failed: {type(exc).__name__}: {first[:200]}"
    return None
