"""ALST (Arctic Long Sequence Training): Ulysses for Hugging Face models, DeepSpeed 0.19.8's names and behaviour.

``UlyssesSPAttentionHF`` wraps one of transformers' attention functions: query, key and value arrive as
``[batch, heads, local sequence, head_dim]``; they are exchanged for the whole sequence with ``heads / p`` heads
(key/value heads replicated first when there are fewer than ``p``), the wrapped attention runs, and the result is
exchanged back to ``[batch, local sequence, hidden]``. ``register_with_transformers`` puts the wrapper in place of
the model's attention implementation; ``UlyssesSPDataLoaderAdapter`` hands each rank of a sequence group its
slice of each batch. transformers is imported only when registering.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ds_tpsp.sequence._all_to_all import seq_all_to_all
from ds_tpsp.sequence._errors import SequenceParallelError

_WHERE = "UlyssesSPAttentionHF"


class UlyssesSPAttentionHF(torch.nn.Module):
    """DeepSpeed's ``UlyssesSPAttentionHF`` (same arguments) over ``process_group``."""

    def __init__(
        self,
        attn: Any,
        batch_size: int,
        attn_head_count: int,
        attn_head_size: int,
        kv_head_count: int,
        num_hidden_layers: int,
        process_group: Any,
        seq_length_is_variable: bool = False,
        local_seq_length: int | None = None,
        global_seq_length: int | None = None,
        disable_in_eval: bool = False,
    ) -> None:
        super().__init__()
        self.attn = attn
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.sp_rank = dist.get_rank(process_group)
        self.batch_size = batch_size
        self.attn_head_count, self.attn_head_size = attn_head_count, attn_head_size
        self.global_kv_head_count = kv_head_count
        self.num_hidden_layers = num_hidden_layers
        self.seq_length_is_variable = seq_length_is_variable
        self.local_seq_length, self.global_seq_length = local_seq_length, global_seq_length
        self.disable_in_eval = disable_in_eval
        self.core_attn_implementation: str | None = None
        p = self.world_size
        if attn_head_count % p:
            raise SequenceParallelError(
                f"{_WHERE}: {attn_head_count} attention heads are not divisible by the sequence-parallel degree "
                f"{p}; use a degree that divides {attn_head_count}"
            )
        if kv_head_count % p and p % kv_head_count:
            raise SequenceParallelError(
                f"{_WHERE}: {kv_head_count} key/value heads and the sequence-parallel degree {p}: one must divide "
                "the other (fewer key/value heads than ranks are replicated)"
            )
        self.kv_replication_factor = max(1, p // kv_head_count)

    def forward(
        self,
        module: torch.nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Any,
        *args,
        **kwargs,
    ) -> tuple[Tensor, Any]:
        if not module.training and self.disable_in_eval:
            return self.attn(module, query, key, value, attention_mask, *args, **kwargs)
        if "position_ids" not in kwargs or kwargs["position_ids"] is None:
            raise SequenceParallelError(
                f"{_WHERE}: position_ids are required in every forward (each rank's slice keeps its global "
                "positions; UlyssesSPDataLoaderAdapter requires them in the batch)"
            )
        local = query.shape[2]
        if not self.seq_length_is_variable and self.local_seq_length not in (None, local):
            raise SequenceParallelError(
                f"{_WHERE}: a local sequence of {local} tokens, registered for {self.local_seq_length} "
                "(seq_length / sequence_parallel_size); register with seq_length_is_variable=True for varying lengths"
            )
        self.local_seq_length, self.global_seq_length = local, local * self.world_size
        positions = [torch.empty_like(kwargs["position_ids"]) for _ in range(self.world_size)]
        dist.all_gather(positions, kwargs["position_ids"].contiguous(), group=self.process_group)
        kwargs["position_ids"] = torch.cat(positions, dim=1)
        if self.kv_replication_factor > 1:
            key = key.repeat_interleave(self.kv_replication_factor, dim=1)
            value = value.repeat_interleave(self.kv_replication_factor, dim=1)
        # [b, h, s/p, d] -> [b, h/p, s, d]
        q, k, v = (
            seq_all_to_all(t.contiguous(), self.process_group, 1, 2, _WHERE) for t in (query, key, value)
        )
        if self.kv_replication_factor > 1:
            module.num_key_value_groups = q.shape[1] // k.shape[1]
        context, weights = self.attn(module, q, k, v, attention_mask, *args, **kwargs)
        # [b, s, h/p, d] -> [b, s/p, h, d] -> [b, s/p, h*d]
        out = seq_all_to_all(context.contiguous(), self.process_group, 1, 2, _WHERE)
        return out.flatten(2), weights

    @classmethod
    def register_with_transformers(
        cls,
        model_name_or_path: Any,
        core_attn_implementation: str,
        sequence_parallel_size: int,
        micro_batch_size: int,
        seq_length: int | None = None,
        seq_length_is_variable: bool = True,
        disable_in_eval: bool = False,
        max_length: int | None = None,
        *,
        process_group: Any = None,
    ) -> UlyssesSPAttentionHF | None:
        """Replace ``core_attn_implementation`` in transformers' attention registry by the Ulysses wrapper over
        ``process_group``; returns the wrapper (None at sequence-parallel size 1). DeepSpeed's form (which makes
        the groups and returns its mpu) is ``deepspeed.runtime.sequence_parallel.ulysses_sp``'s."""
        if sequence_parallel_size == 1:
            return None
        seq_length = seq_length if seq_length is not None else max_length
        if not seq_length_is_variable and seq_length is None:
            raise ValueError(
                "Either `seq_length_is_variable` needs to be `True` or `seq_length` needs to be set"
            )
        from transformers import AutoConfig
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        loaded = hasattr(model_name_or_path, "config")
        config = model_name_or_path.config if loaded else AutoConfig.from_pretrained(model_name_or_path)
        active = getattr(config, "_attn_implementation", None) if loaded else None
        if active is not None and active != core_attn_implementation:
            raise ValueError(
                f"core_attn_implementation='{core_attn_implementation}' does not match the model's "
                f"attn_implementation='{active}'; set both to the same value"
            )
        if core_attn_implementation in ("eager", "paged|eager"):
            raise ValueError(
                f"{core_attn_implementation} attn_implementation isn't supported by Ulysses sequence parallelism: "
                "it needs a 4D attention_mask (O(n^2) memory); use 'sdpa', 'flex_attention' or flash attention"
            )
        if core_attn_implementation not in ALL_ATTENTION_FUNCTIONS:
            raise ValueError(f"{core_attn_implementation} is not a valid attn_implementation")
        text = config.get_text_config()
        heads = text.num_attention_heads
        uattn = cls(
            attn=ALL_ATTENTION_FUNCTIONS[core_attn_implementation],
            batch_size=micro_batch_size,
            attn_head_count=heads,
            attn_head_size=getattr(text, "head_dim", None) or text.hidden_size // heads,
            kv_head_count=text.num_key_value_heads,
            num_hidden_layers=text.num_hidden_layers,
            process_group=process_group,
            seq_length_is_variable=seq_length_is_variable,
            local_seq_length=None if seq_length_is_variable else seq_length // sequence_parallel_size,
            global_seq_length=None if seq_length_is_variable else seq_length,
            disable_in_eval=disable_in_eval,
        )
        uattn.core_attn_implementation = core_attn_implementation

        def uattn_wrapper(module, query, key, value, attention_mask, *args, **kwargs):
            # the mask transformers made is for the local slice: drop it (causality comes from the positions),
            # keeping flex attention's BlockMask, as DeepSpeed does
            if type(attention_mask).__name__ != "BlockMask":
                attention_mask = None
            return uattn(module, query, key, value, attention_mask, *args, **kwargs)

        ALL_ATTENTION_FUNCTIONS[core_attn_implementation] = uattn_wrapper
        return uattn


class UlyssesSPDataLoaderAdapter:
    """DeepSpeed's adapter: each batch of each rank of the sequence group is gathered and sliced along the
    sequence, so that the group computes one rank's batch at a time (``len`` is ``sp`` times the loader's).
    ``labels`` become pre-shifted ``shift_labels`` (padded with -100) before slicing."""

    def __init__(self, dl: Any, sp_rank: int, sp_group: Any, sp_world_size: int, device: Any) -> None:
        self.dl, self.sp_rank, self.sp_group, self.sp_world_size, self.device = (
            dl, sp_rank, sp_group, sp_world_size, device,
        )  # fmt: skip
        self.iter = iter(dl)
        self.micro_batches: deque[dict] = deque()

    def __len__(self) -> int:
        return len(self.dl) * self.sp_world_size

    def __iter__(self) -> UlyssesSPDataLoaderAdapter:
        return self

    def __next__(self) -> dict:
        if not self.micro_batches:
            self.refill()
        return self.micro_batches.popleft()

    def refill(self) -> None:
        try:
            batch = next(self.iter)
        except StopIteration:
            self.iter = iter(self.dl)
            raise
        if "position_ids" not in batch:
            raise ValueError(
                "Ulysses SP requires `position_ids` in every dataloader batch (torch.arange(seq_len) per sample "
                "for unpacked sequences) so that each token keeps its global position after slicing"
            )
        p, group = self.sp_world_size, self.sp_group
        seqlen = torch.tensor([batch["input_ids"].shape[1]], dtype=torch.int64)
        seqlens = [torch.zeros(1, dtype=torch.int64) for _ in range(p)]
        dist.all_gather(seqlens, seqlen, group=group)
        per_rank: list[dict] = [{} for _ in range(p)]
        for name, value in batch.items():
            if torch.is_tensor(value):
                if value.shape[1] != seqlen.item():
                    raise ValueError(
                        f"{name}'s shape {tuple(value.shape)} must match input_ids's on dimension 1"
                    )
                value = value.contiguous()
                parts = [value.new_zeros((value.shape[0], int(n[0]), *value.shape[2:])) for n in seqlens]
                dist.all_gather(parts, value, group=group)
            else:
                parts = [None] * p
                dist.all_gather_object(parts, value, group=group)
            for rank, part in enumerate(parts):
                per_rank[rank][name] = part
        for micro in per_rank:
            length = micro["input_ids"].shape[1]
            if length % p:
                raise SequenceParallelError(
                    f"UlyssesSPDataLoaderAdapter: a batch's sequence length {length} is not divisible by the "
                    f"sequence-parallel degree {p}; pad the sequences to a multiple of {p}"
                )
            chunk = length // p
            labels = micro.pop("labels")
            micro["shift_labels"] = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
            for name, value in micro.items():
                if torch.is_tensor(value):
                    micro[name] = value[:, chunk * self.sp_rank : chunk * (self.sp_rank + 1)].to(self.device)
            self.micro_batches.append(micro)
