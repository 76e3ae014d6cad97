"""DeepSpeed-Ulysses attention: ``DistributedAttention`` around any local attention."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ds_tpsp.sequence._all_to_all import seq_all_to_all
from ds_tpsp.sequence._errors import SequenceParallelError


def apply_rotary_pos_emb(t: Tensor, freqs_cos: Tensor, freqs_sin: Tensor) -> Tensor:
    """Rotate the first ``freqs_cos.shape[-1]`` features of ``t`` (halves convention); the rest pass through."""
    rot = freqs_cos.shape[-1]
    t, rest = t[..., :rot], t[..., rot:]
    first, second = t.chunk(2, dim=-1)
    t = t * freqs_cos + torch.cat((-second, first), dim=-1) * freqs_sin
    return t if rest.shape[-1] == 0 else torch.cat((t, rest), dim=-1)


class DistributedAttention(nn.Module):
    """Attention over a sequence split across ``sequence_process_group`` (DeepSpeed's class and arguments).

    Each rank holds a slice of the sequence with every head. ``forward`` exchanges query, key and value so that
    each rank holds the whole sequence with ``heads / p`` heads (scatter ``scatter_idx``, gather ``gather_idx``),
    runs ``local_attention`` on that, and exchanges the result back. DeepSpeed's defaults (``scatter_idx=2``,
    ``gather_idx=0``) are the sequence-first layout ``[s, b, h, d]``; a batch-first model ``[b, s, h, d]``
    passes ``gather_idx=1`` and ``batch_dim_idx=0``.

    ds differs from DeepSpeed 0.19.8 in one way, loudly: a head count that does not divide by the degree is an
    error (DeepSpeed splits such heads unevenly); ``sp_stream`` (CUDA stream overlap) is accepted and unused.
    """

    def __init__(
        self,
        local_attention: nn.Module | Any,
        sequence_process_group: Any,
        scatter_idx: int = 2,
        gather_idx: int = 0,
        sp_stream: Any = None,
        num_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        self.local_attn = local_attention
        self.spg = sequence_process_group
        self.scatter_idx = scatter_idx
        self.gather_idx = gather_idx
        self.sp_stream = sp_stream
        self.num_kv_heads = num_kv_heads

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        batch_dim_idx: int = 0,
        rotary_pos_emb: tuple[Tensor, Tensor] | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Tensor:
        if batch_dim_idx not in (0, 1) or batch_dim_idx in (
            self.scatter_idx % query.dim(),
            self.gather_idx % query.dim(),
        ):
            raise SequenceParallelError(
                f"DistributedAttention: batch_dim_idx={batch_dim_idx} must be 0 or 1 and differ from "
                f"scatter_idx={self.scatter_idx} and gather_idx={self.gather_idx}"
            )
        degree = dist.get_world_size(self.spg)
        for name, t in (("query", query), ("key", key), ("value", value)):
            heads = t.shape[self.scatter_idx]
            if heads % degree:
                raise SequenceParallelError(
                    f"DistributedAttention: {name} has {heads} heads (dimension {self.scatter_idx} of "
                    f"{tuple(t.shape)}), not divisible by the sequence-parallel degree {degree}; use a head count "
                    f"divisible by {degree} or a degree that divides {heads} (DeepSpeed 0.19.8 splits uneven heads "
                    "unevenly; ds does not)"
                )
        where = "DistributedAttention"
        q, k, v = (
            seq_all_to_all(t, self.spg, self.scatter_idx, self.gather_idx, where) for t in (query, key, value)
        )
        if rotary_pos_emb is not None:  # (cos, sin), sequence in dimension 1, applied to the whole sequence
            cos, sin = (f.permute(1, 0, 2, 3) for f in rotary_pos_emb)
            q, k = apply_rotary_pos_emb(q, cos, sin), apply_rotary_pos_emb(k, cos, sin)
        context = self.local_attn(q, k, v, *args, **kwargs)
        return seq_all_to_all(context, self.spg, self.gather_idx, self.scatter_idx, where)
