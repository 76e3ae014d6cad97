"""A vocabulary-parallel LM head (``tensor_parallel.vocab_parallel_lm_head``): the head split over the vocabulary
with its logits left on their ranks, the causal-LM loss computed from the split logits, and an embedding tied
to the head looking up the same shard.

As DeepSpeed 0.19.8: the head is the ``nn.Linear`` whose name ends with one of ``lm_head_patterns`` (``lm_head``,
``embed_out``); the model's ``loss_function`` (Hugging Face's hook, which its ``forward`` calls with the logits)
is replaced by :class:`VocabParallelCausalLMLoss`; ``forward`` returns this rank's slice of the logits.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import ProcessGroup

from ._comm import reduce_from_tp
from ._layers import ColumnParallelLinear

__all__ = [
    "VocabParallelCausalLMLoss",
    "VocabParallelEmbedding",
    "VocabParallelLinear",
    "install_vocab_parallel_loss",
    "vocab_parallel_cross_entropy",
]


class VocabParallelLinear(ColumnParallelLinear):
    """The LM head with its vocabulary (output features) split over ``group`` and its logits not gathered."""

    def __init__(self, linear: nn.Linear, group: ProcessGroup, *, overlap_comm: bool = False) -> None:
        super().__init__(linear, group, gather_output=False, overlap_comm=overlap_comm)
        rank = dist.get_rank(group)
        self.mp_group = group  # DeepSpeed's names
        self.is_vocab_parallel_lm_head = True
        self.vocab_size = linear.out_features
        self.vocab_start_index = rank * self.out_features
        self.vocab_end_index = self.vocab_start_index + self.out_features


class VocabParallelEmbedding(nn.Module):
    """An embedding tied to a :class:`VocabParallelLinear`: it holds the head's shard (one parameter for both),
    looks up the tokens of its vocabulary slice (zeros for the others) and sums the lookups over the group."""

    def __init__(self, embedding: nn.Embedding, head: VocabParallelLinear) -> None:
        super().__init__()
        self.group = head.group
        self.weight = head.weight
        self.vocab_start_index, self.vocab_end_index = head.vocab_start_index, head.vocab_end_index
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        pad = embedding.padding_idx
        self.padding_idx = pad - self.vocab_start_index if pad is not None and self.owns(pad) else None

    def owns(self, token: int) -> bool:
        return self.vocab_start_index <= token < self.vocab_end_index

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start_index) | (ids >= self.vocab_end_index)
        local = (ids - self.vocab_start_index).masked_fill(outside, 0)
        out = F.embedding(local, self.weight, padding_idx=self.padding_idx)
        return reduce_from_tp(out.masked_fill(outside.unsqueeze(-1), 0.0), self.group)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, vocabulary [{self.vocab_start_index}, {self.vocab_end_index}) here"


def embedding_problem(embedding: nn.Module) -> str | None:
    """Why a tied embedding cannot look up a vocabulary shard (None: it can)."""
    if type(embedding).forward is not nn.Embedding.forward:
        return f"its class {type(embedding).__name__} has a forward of its own"
    if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
        return "it sets max_norm, scale_grad_by_freq or sparse"
    return None


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy of logits split over the vocabulary: the max, the sum of exponentials and the target's
    logit are each reduced over the group; the gradient is this rank's slice of softmax - one-hot."""

    @staticmethod
    def forward(ctx, logits, target, group, start, ignore_index):
        ctx.logits_dtype = logits.dtype
        logits = logits.float()
        local = logits.shape[-1]
        top = logits.amax(dim=-1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        exp = torch.exp(logits - top.unsqueeze(-1))
        total = exp.sum(dim=-1)
        dist.all_reduce(total, group=group)
        valid = target != ignore_index
        here = valid & (target >= start) & (target < start + local)
        index = (target - start).clamp(0, local - 1)
        picked = torch.where(here, logits.gather(-1, index.unsqueeze(-1)).squeeze(-1), torch.zeros_like(top))
        dist.all_reduce(picked, group=group)
        loss = torch.where(valid, torch.log(total) + top - picked, torch.zeros_like(top))
        ctx.save_for_backward(exp, total, index, here, valid)
        return loss

    @staticmethod
    def backward(ctx, grad):
        exp, total, index, here, valid = ctx.saved_tensors
        g = exp / total.unsqueeze(-1)
        g.scatter_add_(-1, index.unsqueeze(-1), -here.unsqueeze(-1).to(g.dtype))
        g *= (valid.to(g.dtype) * grad.to(g.dtype)).unsqueeze(-1)
        return g.to(ctx.logits_dtype), None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    group: ProcessGroup,
    vocab_start_index: int,
    vocab_size: int,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross entropy of ``logits`` (this rank's vocabulary slice, starting at ``vocab_start_index``) against
    ``target`` (whole-vocabulary ids); ``reduction`` none, sum or mean (over the tokens not ignored)."""
    if logits.shape[:-1] != target.shape:
        raise ValueError(
            f"vocab-parallel cross entropy: logits {list(logits.shape)} and target {list(target.shape)} differ "
            "before the vocabulary dimension"
        )
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"vocab-parallel cross entropy: reduction {reduction!r} is not none, sum or mean")
    target = target.long()
    if bool(((target != ignore_index) & ((target < 0) | (target >= vocab_size))).any()):
        raise ValueError(f"vocab-parallel cross entropy: a target is outside the vocabulary of {vocab_size}")
    loss = _VocabParallelCrossEntropy.apply(logits, target, group, vocab_start_index, ignore_index)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (target != ignore_index).sum().clamp_min(1).to(loss.dtype)


class VocabParallelCausalLMLoss:
    """The causal-LM loss from a vocabulary-parallel head's logits, in Hugging Face's ``loss_function`` form:
    ``(logits, labels, vocab_size=None, shift_labels=None, num_items_in_batch=None, **kwargs)``. Labels are
    shifted by one (or ``shift_labels`` taken as they are); the mean over the tokens not ignored, or the sum
    divided by ``num_items_in_batch`` when given (the Trainer's accumulation), as Hugging Face's loss."""

    def __init__(self, head: VocabParallelLinear, ignore_index: int = -100) -> None:
        self.group, self.vocab_start_index = head.group, head.vocab_start_index
        self.vocab_size, self.ignore_index = head.vocab_size, ignore_index

    def __call__(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor | None = None,
        vocab_size: int | None = None,
        shift_labels: torch.Tensor | None = None,
        num_items_in_batch: Any = None,
        ignore_index: int | None = None,
        **_kwargs: Any,
    ) -> torch.Tensor:
        if shift_labels is None:
            if labels is None:
                raise ValueError("the vocab-parallel causal-LM loss needs labels or shift_labels")
            shift_labels = labels[..., 1:]
            logits = logits[..., :-1, :]
        ignore = self.ignore_index if ignore_index is None else ignore_index
        reduction = "mean" if num_items_in_batch is None else "sum"
        loss = vocab_parallel_cross_entropy(
            logits,
            shift_labels.to(logits.device),
            self.group,
            self.vocab_start_index,
            self.vocab_size,
            ignore,
            reduction,
        )
        if num_items_in_batch is not None:
            loss = loss / torch.as_tensor(num_items_in_batch, device=loss.device, dtype=loss.dtype).clamp_min(
                1
            )
        return loss


def install_vocab_parallel_loss(model: nn.Module, loss: Any, *, check_only: bool = False) -> str | None:
    """Make ``loss`` the model's ``loss_function`` (Hugging Face's hook); returns why it cannot (None: done).
    ``check_only`` tries and puts the model's own back."""
    if not hasattr(model, "loss_function"):
        return f"{type(model).__name__} has no loss_function (Hugging Face's hook its forward computes the loss with)"
    original = model.loss_function
    try:
        model.loss_function = loss
    except (AttributeError, TypeError) as exc:
        return f"{type(model).__name__}.loss_function cannot be set ({exc})"
    if model.loss_function is not loss:
        model.loss_function = original
        return f"{type(model).__name__}.loss_function ignores what is set to it"
    if check_only:
        model.loss_function = original
    else:
        model._ds_original_loss_function = original
    return None
