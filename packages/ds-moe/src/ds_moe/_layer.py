"""The mixture-of-experts layer: a gate, this rank's experts, all-to-all over the expert-parallel group.

``MoE(hidden_size, expert, num_experts, ep_size, k, ...)`` keeps ``num_experts / ep_size`` copies of
``expert`` (this rank's share) and returns ``(output, l_aux, exp_counts)``. Its groups come from outside
(``set_process_groups``; ds-engine passes its topology's ``expert_groups(ep_size)``); without one (ep 1,
or before the engine set it) the layer runs alone. Expert parameters carry ``allreduce = False`` and
``group_name = "ep_size_<ep>"`` (DeepSpeed's marks): their gradients are reduced over the expert-data-parallel
group, the others' over the data-parallel one.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ._dispatch import all_to_all, combine, dispatch
from ._gate import Routes, top1_routes, top2_routes

__all__ = ["MOELayer", "Experts", "MoE", "TopKGate"]


class Experts(nn.Module):
    """This rank's experts: ``num_local_experts`` deep copies of ``expert``, each fed its own slice of the buffer."""

    def __init__(
        self, expert: nn.Module, num_local_experts: int = 1, expert_group_name: str | None = None
    ) -> None:
        super().__init__()
        self.deepspeed_experts = nn.ModuleList(copy.deepcopy(expert) for _ in range(num_local_experts))
        self.num_local_experts = num_local_experts
        for e in self.deepspeed_experts:
            for p in e.parameters():
                p.allreduce = False
                p.group_name = expert_group_name

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """``inputs``: ``[ep, num_local, capacity, M]``; each local expert gets its ``[ep, 1, capacity, M]``."""
        outs = []
        chunks = inputs.chunk(self.num_local_experts, dim=1)
        for chunk, expert in zip(chunks, self.deepspeed_experts, strict=True):
            out = expert(chunk)
            outs.append(out[0] if isinstance(out, tuple) else out)
        return torch.cat(outs, dim=1)


class TopKGate(nn.Module):
    """The router (``wg``, no bias, run in fp32) and the top-1 / top-2 routing of ``_gate``."""

    def __init__(
        self,
        model_dim: int,
        num_experts: int,
        k: int = 1,
        capacity_factor: float = 1.0,
        eval_capacity_factor: float = 1.0,
        min_capacity: int = 8,
        noisy_gate_policy: str | None = None,
        drop_tokens: bool = True,
        use_rts: bool = True,
        ep_group: dist.ProcessGroup | None = None,
        top2_2nd_expert_sampling: bool = True,
    ) -> None:
        super().__init__()
        if k not in (1, 2):
            raise ValueError(f"k={k}: the MoE gate routes each token to its top 1 or top 2 experts only")
        self.wg = nn.Linear(model_dim, num_experts, bias=False)
        self.ep_group = ep_group
        self.k = k
        self.capacity_factor = capacity_factor
        self.eval_capacity_factor = eval_capacity_factor
        self.min_capacity = min_capacity
        self.noisy_gate_policy = noisy_gate_policy
        self.drop_tokens = drop_tokens
        self.use_rts = use_rts
        self.top2_2nd_expert_sampling = top2_2nd_expert_sampling

    def forward(self, x: torch.Tensor, used_token: torch.Tensor | None = None) -> Routes:
        xf = x.float()
        if self.noisy_gate_policy == "Jitter" and self.training:
            eps = 1e-2
            lo, hi = torch.tensor(1.0 - eps, device=x.device), torch.tensor(1.0 + eps, device=x.device)
            xf = xf * torch.distributions.Uniform(lo, hi).rsample(xf.shape)
        logits = F.linear(xf, self.wg.weight.float())
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        if self.k == 1:
            return top1_routes(
                logits,
                factor,
                self.min_capacity,
                used_token=used_token,
                noisy_gate_policy=self.noisy_gate_policy if self.training else None,
                drop_tokens=self.drop_tokens,
                use_rts=self.use_rts,
                group=self.ep_group,
            )
        return top2_routes(
            logits,
            factor,
            self.min_capacity,
            drop_tokens=self.drop_tokens,
            second_sampling=self.top2_2nd_expert_sampling,
            group=self.ep_group,
        )


class MOELayer(nn.Module):
    """Gate, dispatch, all-to-all, experts, all-to-all, combine. Sets ``l_aux`` and ``exp_counts``."""

    def __init__(self, gate: TopKGate, experts: Experts, ep_size: int, num_local_experts: int) -> None:
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.ep_group: dist.ProcessGroup | None = None
        self.ep_size = ep_size
        self.num_local_experts = num_local_experts
        self.l_aux: torch.Tensor | None = None
        self.exp_counts: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, used_token: torch.Tensor | None = None) -> torch.Tensor:
        if self.ep_size > 1 and self.ep_group is None:
            raise RuntimeError(
                f"this MoE layer has ep_size={self.ep_size} but no expert-parallel group: build the engine "
                "first (deepspeed.initialize sets it), or call set_process_groups(ep_group, expert_dp_group)"
            )
        width = x.shape[-1]
        tokens = x.reshape(-1, width)
        r = self.gate(tokens, used_token)
        self.l_aux, self.exp_counts = r.l_aux, r.exp_counts
        num_experts = self.ep_size * self.num_local_experts
        buf, rows = dispatch(tokens, r.experts, r.slots, num_experts, r.capacity)
        buf = all_to_all(buf, self.ep_group)
        out = self.experts(buf.reshape(self.ep_size, self.num_local_experts, -1, width))
        out = all_to_all(out.reshape(num_experts, -1, width), self.ep_group)
        return combine(out, rows, r.weights).reshape(x.shape)


class MoE(nn.Module):
    """DeepSpeed-MoE's layer (its arguments and defaults); ``forward`` returns ``(output, l_aux, exp_counts)``."""

    def __init__(
        self,
        hidden_size: int,
        expert: nn.Module,
        num_experts: int = 1,
        ep_size: int = 1,
        k: int = 1,
        capacity_factor: float = 1.0,
        eval_capacity_factor: float = 1.0,
        min_capacity: int = 4,
        use_residual: bool = False,
        noisy_gate_policy: str | None = None,
        drop_tokens: bool = True,
        use_rts: bool = True,
        use_tutel: bool = False,
        enable_expert_tensor_parallelism: bool = False,
        top2_2nd_expert_sampling: bool = True,
    ) -> None:
        super().__init__()
        if num_experts % ep_size:
            raise ValueError(f"num_experts={num_experts} must be a multiple of ep_size={ep_size}")
        if noisy_gate_policy not in (None, "None", "Jitter", "RSample"):
            raise ValueError(f"noisy_gate_policy={noisy_gate_policy!r}: one of None, 'Jitter', 'RSample'")
        self.use_residual = use_residual
        self.enable_expert_tensor_parallelism = enable_expert_tensor_parallelism
        self.ep_size = ep_size
        self.expert_group_name = f"ep_size_{ep_size}"
        self.num_experts = num_experts
        self.num_local_experts = num_experts // ep_size
        gate = TopKGate(
            hidden_size,
            num_experts,
            k,
            capacity_factor,
            eval_capacity_factor,
            min_capacity,
            noisy_gate_policy,
            drop_tokens,
            use_rts,
            None,
            top2_2nd_expert_sampling,
        )
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        self.deepspeed_moe = MOELayer(gate, experts, ep_size, self.num_local_experts)
        if use_residual:
            self.mlp = expert
            self.coefficient = nn.Linear(hidden_size, 2)
        self.expert_dp_group: dist.ProcessGroup | None = None

    def set_process_groups(
        self, ep_group: dist.ProcessGroup | None, expert_dp_group: dist.ProcessGroup | None = None
    ) -> None:
        """The expert-parallel group (its ``ep_size`` ranks exchange tokens) and the expert-data-parallel one."""
        if ep_group is not None and dist.get_world_size(ep_group) != self.ep_size:
            raise ValueError(
                f"the expert-parallel group has {dist.get_world_size(ep_group)} ranks, this layer's ep_size is "
                f"{self.ep_size}"
            )
        self.deepspeed_moe.ep_group = ep_group
        self.deepspeed_moe.gate.ep_group = ep_group
        self.expert_dp_group = expert_dp_group

    def forward(
        self, hidden_states: torch.Tensor, used_token: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            dense = self.mlp(hidden_states)
            dense = dense[0] if isinstance(dense, tuple) else dense
            coef = F.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * coef[..., 0:1] + dense * coef[..., 1:]
        return output, self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts
