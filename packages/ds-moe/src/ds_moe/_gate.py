"""Top-1 and top-2 gating with expert capacity, token dropping and the load-balancing loss (GShard's,
as DeepSpeed-MoE computes it).

A gate turns the router's logits ``[S, E]`` (S tokens, E experts) into routes: for each of its ``k``
choices, every token's expert (``-1`` when the token was dropped for that choice), its slot in the expert's
buffer of ``capacity`` rows, and its weight. Facts kept from DeepSpeed 0.19.8 so that losses compare:

* capacity: ``max(ceil(S / E * capacity_factor * k), min_capacity)``; without ``drop_tokens`` it is the
  largest expert count over the expert-parallel group (all-reduce MAX), for top-1 at most S.
* top-1 drops by Random Token Selection (``use_rts``: each expert keeps the tokens with the largest
  uniform draws, else ``topk`` over the 0/1 mask); its weight is the token's softmax probability.
  ``noisy_gate_policy="RSample"`` picks the expert on Gumbel-noised logits.
* top-2: the second expert is the argmax of the logits (Gumbel-noised with ``top2_2nd_expert_sampling``)
  without the first; second choices queue behind every first choice; the two weights are normalised.
* ``l_aux``: top-1 ``sum(me * ce) * E``; top-2 ``mean(me * ce) * E * E`` (``me``: mean probability per
  expert, ``ce``: fraction of tokens whose first choice it is, before dropping).
* ``exp_counts``: tokens routed to each expert (both choices), before dropping.
The random draws use torch's generator in DeepSpeed's order (Gumbel, then the uniform of RTS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["Routes", "top1_routes", "top2_routes"]


@dataclass
class Routes:
    """``experts``, ``slots``: ``[k, S]`` int64 (expert -1: dropped); ``weights``: ``[k, S]`` float."""

    l_aux: torch.Tensor
    capacity: int
    experts: torch.Tensor
    slots: torch.Tensor
    weights: torch.Tensor
    exp_counts: torch.Tensor


def _capacity(tokens: int, experts: int, factor: float, min_capacity: int) -> int:
    # float32 as torch computes it (the factor travels as a float32 tensor in DeepSpeed)
    per = torch.tensor(tokens / experts, dtype=torch.float32) * torch.tensor(factor, dtype=torch.float32)
    return max(int(math.ceil(per.item())), int(min_capacity))


def _max_over(count: torch.Tensor, group: dist.ProcessGroup | None) -> int:
    top = count.max().clone()
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    return int(top.item())


def _gumbel(shape: torch.Size, device: torch.device) -> torch.Tensor:
    zero, one = torch.tensor(0.0, device=device), torch.tensor(1.0, device=device)
    return torch.distributions.Gumbel(zero, one).rsample(shape)


def top1_routes(
    logits: torch.Tensor,
    capacity_factor: float,
    min_capacity: int,
    *,
    used_token: torch.Tensor | None = None,
    noisy_gate_policy: str | None = None,
    drop_tokens: bool = True,
    use_rts: bool = True,
    group: dist.ProcessGroup | None = None,
) -> Routes:
    tokens, num_experts = logits.shape
    noisy = logits + _gumbel(logits.shape, logits.device) if noisy_gate_policy == "RSample" else None
    probs = F.softmax(logits, dim=1)
    capacity = _capacity(tokens, num_experts, capacity_factor, min_capacity)
    first = torch.argmax(noisy if noisy is not None else probs, dim=1)
    mask = F.one_hot(first, num_classes=num_experts)
    if used_token is not None:
        mask = mask * used_token.reshape(-1, 1).to(mask.dtype)
    exp_counts = mask.sum(dim=0).detach()
    if not drop_tokens:
        capacity = min(_max_over(exp_counts, group), tokens)
    l_aux = torch.sum(probs.mean(dim=0) * mask.float().mean(dim=0)) * num_experts
    if use_rts:
        zero, one = torch.tensor(0.0, device=logits.device), torch.tensor(1.0, device=logits.device)
        score = mask * torch.distributions.Uniform(zero, one).rsample(mask.shape)
    else:
        score = mask
    if tokens < min_capacity:
        raise ValueError(
            f"the MoE layer got {tokens} tokens, fewer than min_capacity={min_capacity}: set min_capacity to 0 "
            "or feed more tokens per step (DeepSpeed asserts the same)"
        )
    keep = torch.topk(score, k=min(capacity, tokens), dim=0)[1]
    mask = mask * torch.zeros_like(mask).scatter_(0, keep, 1)
    slot = ((torch.cumsum(mask, dim=0) - 1) * mask).sum(dim=1)
    kept = mask.sum(dim=1) > 0
    experts = torch.where(kept, first, torch.full_like(first, -1))
    weights = (probs * mask).sum(dim=1)
    return Routes(l_aux, capacity, experts.unsqueeze(0), slot.unsqueeze(0), weights.unsqueeze(0), exp_counts)


def top2_routes(
    logits: torch.Tensor,
    capacity_factor: float,
    min_capacity: int,
    *,
    drop_tokens: bool = True,
    second_sampling: bool = True,
    group: dist.ProcessGroup | None = None,
) -> Routes:
    tokens, num_experts = logits.shape
    probs = F.softmax(logits, dim=1)
    first = torch.argmax(probs, dim=1)
    mask1 = F.one_hot(first, num_classes=num_experts)
    pick = logits.detach() + _gumbel(logits.shape, logits.device) if second_sampling else logits.detach()
    second = torch.argmax(pick.masked_fill(mask1.bool(), float("-inf")), dim=1)
    mask2 = F.one_hot(second, num_classes=num_experts)
    loc1 = torch.cumsum(mask1, dim=0) - 1
    loc2 = torch.cumsum(mask2, dim=0) - 1 + mask1.sum(dim=0, keepdim=True)  # behind every first choice
    l_aux = torch.mean(probs.mean(dim=0) * mask1.float().mean(dim=0)) * num_experts * num_experts
    exp_counts = (mask1 + mask2).sum(dim=0).detach()
    if drop_tokens:
        capacity = _capacity(tokens, num_experts, capacity_factor * 2, min_capacity)
        mask1 = mask1 * (loc1 < capacity)
        mask2 = mask2 * (loc2 < capacity)
    else:
        capacity = _max_over(exp_counts, group)
    w1 = (probs * mask1.float()).sum(dim=1)
    w2 = (probs * mask2.float()).sum(dim=1)
    denom = torch.clamp(w1 + w2, min=torch.finfo(w1.dtype).eps)
    experts = torch.stack(
        [torch.where(mask1.any(dim=1), first, -1), torch.where(mask2.any(dim=1), second, -1)]
    )
    slots = torch.stack([(loc1 * mask1).sum(dim=1), (loc2 * mask2).sum(dim=1)])
    return Routes(l_aux, capacity, experts, slots, torch.stack([w1 / denom, w2 / denom]), exp_counts)
