"""1-bit Adam: full-precision Adam warm-up, then error-compensated 1-bit compression of the momentum.

Contract with the engine:
* While ``optimizer.needs_gradient_allreduce`` is True (the warm-up, ``step < freeze_step``) the engine
  averages gradients across data-parallel ranks as usual before ``step()``.
* Once it is False (the compression stage) the engine must NOT all-reduce gradients: ``step()`` takes each
  rank's local gradient, and synchronises the momentum itself with the compressed all-reduce. Param groups
  marked ``non_freeze: True`` are all-reduced in full precision by the optimizer in that stage.
* Works with ZeRO stage 0 only (``supports_zero`` is False): the engine rejects it with stages 1 and 2.

Every rank must call ``step()`` with the same parameters (a missing gradient counts as zeros in the
compression stage, so the collectives always match).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["OneBitAdam"]

COMM_BACKENDS = ("nccl", "gloo", "mpi")

# 2**0 + 2**9 + ... + 2**63 as an int64. Multiplying 8 bytes that are each 0 or 1 (one little-endian int64)
# by it moves byte k's bit to bit 63 - k, and multiplying one byte by it puts bit 7 - k at bit 8k + 7; the
# partial products never share a bit position, so there are no carries in either direction.
_SPREAD = 0x8040201008040201 - 2**64
_LOW_BIT_OF_EACH_BYTE = 0x0101010101010101


def pack_signs(nonneg: torch.Tensor) -> torch.Tensor:
    """Pack a contiguous bool tensor (..., 8k) into uint8 (..., k), first element in the most significant bit."""
    eight = nonneg.contiguous().view(torch.uint8).view(torch.int64)  # (..., k): 8 bools per int64
    return ((eight * _SPREAD) >> 56).to(torch.uint8)


def unpack_signs(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_signs``: bool (..., 8k), True where the sign is +1."""
    # Arithmetic >> 7 may set the top 7 bits; the mask keeps one bit per byte, so every byte is 0 or 1.
    spread = ((packed.to(torch.int64) * _SPREAD) >> 7) & _LOW_BIT_OF_EACH_BYTE  # (..., k)
    return spread.view(torch.uint8).view(torch.bool).reshape(*packed.shape[:-1], -1)


@dataclass
class _Layout:
    """Where each tensor of a param group lives in the group's (W, S) compression buffer.

    Tensor t is padded to ``W * chunk[t]`` elements (a multiple of W * lcm(W, 8)) and split into W chunks;
    chunk r of every tensor sits in row r, columns ``offset[t] : offset[t] + chunk[t]``. Row r is what rank r
    serves, so one all-to-all moves every tensor's chunks at once.
    """

    world_size: int
    numels: list[int]
    chunks: list[int]
    offsets: list[int]

    @classmethod
    def build(cls, numels: list[int], world_size: int) -> _Layout:
        divider = math.lcm(world_size, 8)
        chunks = [math.ceil(n / (world_size * divider)) * divider for n in numels]
        offsets = [sum(chunks[:t]) for t in range(len(chunks))]
        return cls(world_size, numels, chunks, offsets)

    @property
    def columns(self) -> int:
        return sum(self.chunks)

    @property
    def slices(self) -> list[slice]:
        """Tensor t's columns in the (W, S) buffer."""
        return [slice(o, o + c) for o, c in zip(self.offsets, self.chunks)]

    def gather(self, tensors: list[torch.Tensor], out: torch.Tensor) -> None:
        """Copy ``tensors`` into ``out`` (W, S), padding with zeros."""
        for t, x in enumerate(tensors):
            c, o, n = self.chunks[t], self.offsets[t], self.numels[t]
            padded = torch.nn.functional.pad(x.reshape(-1), (0, self.world_size * c - n))
            out[:, o : o + c].copy_(padded.view(self.world_size, c))

    def scatter(self, buf: torch.Tensor, tensors: list[torch.Tensor]) -> None:
        """Copy ``buf`` (W, S) back into ``tensors``, dropping the padding."""
        for t, x in enumerate(tensors):
            c, o, n = self.chunks[t], self.offsets[t], self.numels[t]
            x.copy_(buf[:, o : o + c].reshape(-1)[:n].view_as(x))


class _TorchComm:
    """The two collectives of the compressed all-reduce through torch.distributed."""

    def __init__(self, group: Any) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "OneBitAdam needs torch.distributed initialised (ds_launch.init_distributed or "
                "torch.distributed.init_process_group) before it is built"
            )
        self.group = group
        self.world_size = dist.get_world_size(group)

    def all_to_all(self, rows: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(rows)
        dist.all_to_all_single(out, rows.contiguous(), group=self.group)
        return out

    def all_gather(self, row: torch.Tensor) -> torch.Tensor:
        # Flat output: gloo splits it along dim 0 and wants each piece shaped like ``row``.
        out = torch.empty(self.world_size * row.numel(), dtype=row.dtype, device=row.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, row.reshape(-1).contiguous(), group=self.group)
        return out.view(self.world_size, *row.shape)

    def all_reduce_mean(self, tensors: list[torch.Tensor]) -> None:
        for x in tensors:
            dist.all_reduce(x, group=self.group)
            x.div_(self.world_size)


class _MpiComm:
    """The same collectives through mpi4py; device buffers go straight to a CUDA-aware MPI when asked."""

    def __init__(self, cuda_aware: bool) -> None:
        try:
            from mpi4py import MPI
        except ImportError as exc:  # optional extra
            raise ImportError(
                "comm_backend_name 'mpi' needs mpi4py: pip install 'ds-optim[mpi]' (and an MPI such as openmpi)"
            ) from exc
        self.comm = MPI.COMM_WORLD
        self.world_size = self.comm.Get_size()
        self.cuda_aware = cuda_aware

    def _buffers(self, send: torch.Tensor, recv: torch.Tensor) -> tuple[Any, Any]:
        if self.cuda_aware or send.device.type == "cpu":
            return send, recv  # host tensors via the buffer protocol, CUDA ones via __cuda_array_interface__
        return send.cpu(), torch.empty_like(recv, device="cpu")

    def _exchange(self, send: torch.Tensor, recv: torch.Tensor, op: str) -> torch.Tensor:
        send = send.contiguous()
        s, r = self._buffers(send, recv)
        if s.device.type == "cpu":
            getattr(self.comm, op)(s.numpy(), r.numpy())
        else:
            getattr(self.comm, op)(s, r)
        if r is not recv:
            recv.copy_(r)
        return recv

    def all_to_all(self, rows: torch.Tensor) -> torch.Tensor:
        return self._exchange(rows, torch.empty_like(rows), "Alltoall")

    def all_gather(self, row: torch.Tensor) -> torch.Tensor:
        out = torch.empty((self.world_size, *row.shape), dtype=row.dtype, device=row.device)
        return self._exchange(row, out, "Allgather")

    def all_reduce_mean(self, tensors: list[torch.Tensor]) -> None:
        from mpi4py import MPI

        for x in tensors:
            s, r = self._buffers(x.contiguous(), torch.empty_like(x))
            if s.device.type == "cpu":
                self.comm.Allreduce(s.numpy(), r.numpy(), op=MPI.SUM)
            else:
                self.comm.Allreduce(s, r, op=MPI.SUM)
            x.copy_(r).div_(self.world_size)


def _compress(
    x: torch.Tensor, error: torch.Tensor, cols: list[slice], sizes: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """1-bit compress ``x``: writes ``error = x - scale * sign(x)`` and returns the packed sign bits.

    ``x`` and ``error`` are (W, S) or (S,), tensor t in columns ``cols[t]`` with scale
    ``||x_t|| / sqrt(sizes[t])``. The sign is x's sign bit (so -0.0 counts as -1) in both the error and the
    bits: copysign is one vectorised pass where ``where(x >= 0, s, -s)`` is several times slower on CPU.
    Returns (packed bits (..., S/8) uint8, scales (T,) fp32).
    """
    scales = torch.stack([torch.linalg.vector_norm(x[..., col]) for col in cols])
    scales /= torch.tensor(sizes, dtype=x.dtype, device=x.device).sqrt()
    for t, col in enumerate(cols):
        torch.sub(x[..., col], torch.copysign(scales[t], x[..., col]), out=error[..., col])
    # Packing the sign bits and inverting the bytes gives the +1 bits without a pass over x.
    return pack_signs(torch.signbit(x)).bitwise_not_(), scales


def _float_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.float().contiguous().view(torch.uint8).reshape(-1)


class OneBitAdam(torch.optim.Optimizer):
    """1-bit Adam (Tang et al. 2021) with DeepSpeed's parameters and semantics.

    Warm-up (``step < freeze_step``): m, v Adam moments of the (engine-averaged) gradient, update
    m / (sqrt(v) + eps) + weight_decay * p without bias correction, p -= lr * update. Compression stage: v is
    frozen and m is updated with the local gradient, then replaced by the error-compensated 1-bit all-reduce
    of m (worker and server error buffers, a scale per tensor chunk), optionally multiplied by the group's
    ``exp_avg_mask``.

    ``bias_correction`` and ``eps_inside_sqrt`` are accepted for config compatibility and unused, as in
    DeepSpeed. Error buffers are not part of the state dict and restart at zero after ``load_state_dict``.
    Bytes sent by this rank: ``last_step_bytes_sent``, ``total_bytes_sent``.
    """

    supports_zero = False

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        freeze_step: int = 100000,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        eps_inside_sqrt: bool = False,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        cuda_aware: bool = False,
        comm_backend_name: str = "nccl",
        process_group: Any = None,
    ) -> None:
        if amsgrad:
            raise ValueError(
                "OneBitAdam does not support amsgrad; remove 'amsgrad' from the optimizer params"
            )
        if comm_backend_name not in COMM_BACKENDS:
            raise ValueError(
                f"comm_backend_name {comm_backend_name!r} is not supported; use one of {', '.join(COMM_BACKENDS)}"
            )
        if isinstance(freeze_step, bool) or not isinstance(freeze_step, int) or freeze_step < 0:
            raise ValueError(f"freeze_step must be a non-negative integer, got {freeze_step!r}")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            eps_inside_sqrt=eps_inside_sqrt,
        )
        super().__init__(params, defaults)
        self.freeze_step = freeze_step
        self.cuda_aware = cuda_aware
        self.comm_backend_name = comm_backend_name
        self._comm = _MpiComm(cuda_aware) if comm_backend_name == "mpi" else _TorchComm(process_group)
        self.world_size = self._comm.world_size
        self.frozen = False
        self._errors: dict[int, tuple[_Layout, torch.Tensor, torch.Tensor]] = {}
        self.last_step_bytes_sent = 0
        self.total_bytes_sent = 0

    @property
    def needs_gradient_allreduce(self) -> bool:
        """True while the engine must average gradients before ``step()`` (the warm-up stage)."""
        return not self.frozen

    def fp32_allreduce_bytes(self) -> int:
        """Bytes one rank sends in a ring all-reduce of all momenta in fp32: 2 (W-1)/W * 4 N."""
        n = sum(p.numel() for g in self.param_groups if not g.get("non_freeze") for p in g["params"])
        return int(2 * (self.world_size - 1) / self.world_size * 4 * n)

    def _state_of(self, p: torch.Tensor) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update: warm-up Adam, or (frozen) local momentum + compressed all-reduce."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.last_step_bytes_sent = 0
        for index, group in enumerate(self.param_groups):
            if not self.frozen:
                self._warmup_group(group)
            elif group.get("non_freeze", False):
                self._non_freeze_group(group)
            else:
                self._compressed_group(index, group)
        self.total_bytes_sent += self.last_step_bytes_sent
        if not self.frozen and self._max_step() >= self.freeze_step:
            self.frozen = True
        return loss

    def _max_step(self) -> int:
        return max((s["step"] for s in self.state.values()), default=0)

    def _warmup_group(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        states = [self._state_of(p) for p in params]
        beta1, beta2 = group["betas"]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        grads = [p.grad for p in params]
        torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
        self._apply_update(group, params, states)

    def _non_freeze_group(self, group: dict[str, Any]) -> None:
        grads = [p.grad for p in group["params"] if p.grad is not None]
        self._comm.all_reduce_mean(grads)
        n = sum(g.numel() * g.element_size() for g in grads)
        self.last_step_bytes_sent += int(2 * (self.world_size - 1) / self.world_size * n)
        self._warmup_group(group)

    def _compressed_group(self, index: int, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.requires_grad]
        if not params:
            return
        states = [self._state_of(p) for p in params]
        beta1 = group["betas"][0]
        exp_avgs = [s["exp_avg"] for s in states]
        for p, m in zip(params, exp_avgs):
            if p.grad is None:
                m.mul_(beta1)
            else:
                m.lerp_(p.grad, 1.0 - beta1)
        self._compressed_allreduce(index, exp_avgs)
        mask = group.get("exp_avg_mask")
        if mask is not None:
            for m in exp_avgs:
                m.mul_(mask.to(m.device))
        self._apply_update(group, params, states)

    def _apply_update(self, group: dict[str, Any], params: list[torch.Tensor], states: list[dict]) -> None:
        """p -= lr * (m / (sqrt(v) + eps) + wd * p); no bias correction, as in 1-bit Adam."""
        exp_avgs = [s["exp_avg"] for s in states]
        denoms = torch._foreach_add(torch._foreach_sqrt([s["exp_avg_sq"] for s in states]), group["eps"])
        updates = torch._foreach_div(exp_avgs, denoms)
        if group["weight_decay"] > 0:
            torch._foreach_add_(updates, params, alpha=group["weight_decay"])
        torch._foreach_add_(params, updates, alpha=-group["lr"])
        for s in states:
            s["step"] += 1

    def _buffers(self, index: int, tensors: list[torch.Tensor]) -> tuple[_Layout, torch.Tensor, torch.Tensor]:
        if index not in self._errors:
            device = tensors[0].device
            layout = _Layout.build([t.numel() for t in tensors], self.world_size)
            worker_error = torch.zeros(self.world_size, layout.columns, device=device)
            server_error = torch.zeros(layout.columns, device=device)
            self._errors[index] = (layout, worker_error, server_error)
        return self._errors[index]

    def _compressed_allreduce(self, index: int, tensors: list[torch.Tensor]) -> None:
        """Replace ``tensors`` by their cross-rank mean through two 1-bit phases with error feedback."""
        layout, worker_error, server_error = self._buffers(index, tensors)
        world, cols = self.world_size, layout.slices

        # Phase 1 (worker): compress m + worker error with one scale per tensor; send chunk r to rank r.
        buf = torch.empty_like(worker_error)  # (W, S)
        layout.gather(tensors, buf)
        buf += worker_error
        packed, worker_scales = _compress(buf, worker_error, cols, [world * c for c in layout.chunks])
        scale_bytes = _float_bytes(worker_scales).expand(world, -1)  # (W, 4T)
        received = self._comm.all_to_all(torch.cat([packed, scale_bytes], dim=1))
        packed_cols = layout.columns // 8
        their_nonneg = unpack_signs(received[:, :packed_cols])  # (W, S): every rank's signs of my chunk
        their_scales = received[:, packed_cols:].contiguous().view(torch.float32)  # (W, T)

        # Phase 2 (server): average my chunk, compress it with server error feedback, all-gather it.
        their_bits = their_nonneg.view(torch.uint8)  # (W, S) of 0/1
        mean = server_error.clone()  # (S,)
        for t, col in enumerate(cols):
            # mean of sign_w * scale_w = (2 * sum_w bit_w * scale_w - sum_w scale_w) / W, bit in {0, 1}
            scales = their_scales[:, t].tolist()
            for w, scale in enumerate(scales):
                mean[col].add_(their_bits[w, col], alpha=2.0 * scale / world)
            mean[col] -= sum(scales) / world
        packed, server_scales = _compress(mean, server_error, cols, layout.chunks)
        gathered = self._comm.all_gather(torch.cat([packed, _float_bytes(server_scales)]))
        bits = unpack_signs(gathered[:, :packed_cols]).view(torch.uint8)  # (W, S) of 0/1
        scales = gathered[:, packed_cols:].contiguous().view(torch.float32)  # (W, T)
        values = bits.to(torch.float32)  # (W, S): becomes +-scale of each rank's chunk
        for t, col in enumerate(cols):
            s = scales[:, t : t + 1]
            values[:, col].mul_(2.0 * s).sub_(s)
        layout.scatter(values, tensors)

        row_bytes = packed_cols + 4 * len(layout.chunks)
        self.last_step_bytes_sent += 2 * (world - 1) * row_bytes

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load moments and steps; keep the current ``exp_avg_mask``s; restart error feedback at zero."""
        masks = [g.get("exp_avg_mask") for g in self.param_groups]
        super().load_state_dict(state_dict)
        for group, mask in zip(self.param_groups, masks):
            group.pop("exp_avg_mask", None)
            if mask is not None:
                group["exp_avg_mask"] = mask
        self._errors.clear()
        self.frozen = self._max_step() >= self.freeze_step
