"""Stage 3 parameter partitions: each rank keeps its slice of every group's flat space; full tensors on demand.

The flat space of an optimizer param group is the one of stages 1 and 2 (``GroupLayout``): parameters in
group order, padded, cut into ``dp`` contiguous partitions. So a stage-3 rank owns exactly the elements
a stage-1/2 rank owns, and checkpoints move between stages without conversion.

A released parameter's ``.data`` is an empty tensor; gathering gives it a full tensor again: always the
same one, the slot's ``home``, whose *storage* is freed on release (resized to 0 bytes) and allocated
again by the next gather. Autograd saves views of a weight for backward (``nn.Linear`` saves
``weight.t()``); with a fresh tensor per gather, each saved view kept its forward's copy alive until
backward, so every weight the forward used stayed whole through the forward (the whole model, measured:
``tools/bench/trace_stage3_rss.py``). A saved view of the home shares its storage, so freeing the storage frees
it, and backward's re-gather refills it.

A gather is coalesced: the parameters a fetch, a prefetch or the refresh after a step makes whole travel in
one batch: one collective over shared memory (packed into its rounds), one job of the MPI transport's
thread (still one ``Bcast`` per piece), one broadcast per owner of each run of flat-contiguous parameters on
torch.distributed (``_launch_gather``), instead of one collective per parameter and owner.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .. import _transport
from .._comm import ProcessGroup, broadcast_async, global_rank, group_rank, group_size
from .._layout import GroupLayout
from ._construct import forget_construction, full_value, is_constructed_partitioned, source_shape
from ._frozen import FrozenPart, launch_frozen_gather
from ._param_swap import ParamSwap
from ._quant import WEIGHT_BITS, WEIGHT_BLOCK, dequantize, payload_bytes, quantize
from ._status import ZeroParamStatus, mark, set_status
from ._zeropp import SecondaryGather, _Then

__all__ = ["ParamSlot", "PartitionedParams"]


@dataclass(eq=False)
class ParamSlot:
    """Where one parameter lives in its group's flat space, and who currently holds it whole."""

    param: nn.Parameter
    name: str
    group: int
    index: int
    start: int
    end: int
    shape: torch.Size
    persistent: bool  # at most stage3_param_persistence_threshold elements: stays whole on every rank
    fwd_users: int = 0  # modules in whose forward the parameter currently is
    pins: int = 0  # open GatheredParameters blocks holding it whole
    bwd_hold: bool = False  # backward reached its module and its gradient has not arrived yet
    gathered: bool = False
    home: torch.Tensor | None = None  # the full tensor while gathered; its storage is empty when released
    secondary: torch.Tensor | None = None  # hpZ: this rank's chunk of the value last gathered (``_zeropp``)
    frozen: FrozenPart | None = None  # a frozen parameter's own partition (``_frozen``); its group is -1

    @property
    def numel(self) -> int:
        return self.end - self.start


class PartitionedParams:
    """The partitions of every group in the model dtype, and gather/release of full parameters.

    ``parts[g]`` is this rank's partition of group ``g`` (padding included), unless the partitions are in
    files (``swap``, ``offload_param.device: "nvme"``): then ``parts`` is None and every access goes through
    ``read_part``/``write_part`` and the gathers, which read each parameter's piece through the swap
    buffers. ``on_write(g, lo, hi)`` is called after elements ``[lo, hi)`` of the partition were
    overwritten from outside a step (a load, a ``GatheredParameters`` modification), so the owner of the
    fp32 masters can copy them.

    ``frozen``: the model's frozen parameters. Each is kept as a partition of its own (``_frozen``), in a
    slot of group -1 that is in no layout: in its dtype, or int8 with ``quantize_frozen``
    (``zero_quantized_nontrainable_weights``); those that persist (the rule of trainable parameters) stay
    whole in their dtype, unmanaged.
    """

    def __init__(
        self,
        groups: Sequence[Sequence[nn.Parameter]],
        names: dict[int, str],
        *,
        process_group: ProcessGroup | None,
        persistence_threshold: int,
        model_persistence_threshold: int = sys.maxsize,
        partition_device: torch.device | None = None,
        swap: ParamSwap | None = None,
        hpz: SecondaryGather | None = None,
        quantize_weights: bool = False,
        frozen: Sequence[nn.Parameter] = (),
        quantize_frozen: bool = False,
    ) -> None:
        self.process_group = process_group
        self.hpz = hpz  # zero_hpz_partition_size: gathers from the secondary partitions when they are valid
        self.quantize_weights = quantize_weights  # zero_quantized_weights: int8 on the primary gathers
        self.dp = group_size(process_group)
        self.rank = group_rank(process_group)
        self.layouts: list[GroupLayout] = []
        self.swap = swap
        self._parts: list[torch.Tensor] = []
        self.part_numels: list[int] = []
        self.part_dtypes: list[torch.dtype] = []
        # where each group's parameters compute, and so where its collectives run: with offload_param the
        # partitions are in CPU memory, which nccl cannot carry
        self.compute_devices: list[torch.device] = []
        self.slots: dict[int, ParamSlot] = {}  # id(param) -> slot
        self.on_write: Callable[[int, int, int], None] | None = None
        self.gather_calls = 0  # collectives issued to gather parameters (observed by the tests)
        self.gathered_numel = 0  # elements those collectives carried
        self.secondary_numel = 0  # elements gathered from the hpZ secondary partitions instead
        self.live_numel = 0  # elements of non-persistent parameters now held whole
        self.peak_live_numel = 0
        self._pending: dict[int, list] = {}  # id(slot) -> works of a prefetch still in flight
        # DeepSpeed's rule: in model order, a parameter of at most ``persistence_threshold`` elements stays
        # whole unless it would take the persistent total past ``model_persistence_threshold``
        self._persist_budget = (persistence_threshold, model_persistence_threshold)
        self.persistent_numel = 0
        for g, params in enumerate(groups):
            self._partition_group(g, params, names, partition_device)
        for p in frozen:
            if id(p) in self.slots:
                continue
            self._partition_frozen(p, names, partition_device, quantize_frozen)

    # ------------------------------------------------------------------ setup
    def _partition_group(
        self,
        g: int,
        params: Sequence[nn.Parameter],
        names: dict[int, str],
        partition_device: torch.device | None,
    ) -> None:
        layout = GroupLayout.build([source_shape(p) for p in params], self.dp)
        dtype = params[0].dtype if params else torch.float32
        device = params[0].device if params else torch.device("cpu")
        ps, pe = layout.partition_range(self.rank)
        swap = self.swap
        if swap is None:
            part = torch.zeros(layout.partition_numel, dtype=dtype, device=partition_device or device)
        else:  # the pieces of this rank's partition, in model order (``_param_swap``)
            ranges = [layout.param_range(i) for i in range(len(params))]
            swap.add_group(dtype, [(id(p), names.get(id(p), f"group{g}.param{i}"), max(a, ps) - ps, min(b, pe) - ps)
                                   for i, (p, (a, b)) in enumerate(zip(params, ranges)) if max(a, ps) < min(b, pe)])  # fmt: skip
        for i, p in enumerate(params):
            if id(p) in self.slots:
                raise ValueError(f"parameter {names.get(id(p), i)} is in two param groups; give it to one")
            start, end = layout.param_range(i)
            shape = source_shape(p)
            full = full_value(p).to(dtype).reshape(-1)  # one parameter at a time (collective if cut)
            lo, hi = max(start, ps), min(end, pe)
            if lo < hi and swap is None:
                part[lo - ps : hi - ps].copy_(full[lo - start : hi - start])
            elif lo < hi:
                swap.write_piece(id(p), full[lo - start : hi - start])
            slot = ParamSlot(p, names.get(id(p), f"group{g}.param{i}"), g, i, start, end, shape,
                             persistent=self._persists(shape.numel()))  # fmt: skip
            self.slots[id(p)] = slot
            p.ds_stage3 = self  # lets GatheredParameters find the manager of a parameter
            if slot.persistent:
                p.data = full.view(shape).clone()
                slot.gathered = True
            else:
                p.data = torch.empty(0, dtype=dtype, device=device)
            forget_construction(p)
            local = part[max(lo - ps, 0) : max(hi - ps, 0)] if swap is None else swap.local(id(p))
            mark(p, shape, local, whole=slot.persistent)
            del full
        self.layouts.append(layout)
        if swap is None:
            self._parts.append(part)
        self.part_numels.append(layout.partition_numel)
        self.part_dtypes.append(dtype)
        self.compute_devices.append(device)

    def _partition_frozen(
        self, p: nn.Parameter, names: dict[int, str], device: torch.device | None, quantized: bool
    ) -> None:
        """Keep ``p`` (frozen) as this rank's chunk of it (int8 when ``quantized``), or whole when it persists."""
        shape = source_shape(p)
        if self._persists(shape.numel()):
            if is_constructed_partitioned(p):
                _make_whole(p)
            return
        full = full_value(p).reshape(-1)  # collective if cut at construction
        forget_construction(p)
        part = FrozenPart.cut(full, self.dp, self.rank, device or p.device, quantized=quantized)
        del full
        slot = ParamSlot(p, names.get(id(p), f"frozen{len(self.slots)}"), -1, -1, 0, shape.numel(), shape,
                         persistent=False, frozen=part)  # fmt: skip
        self.slots[id(p)] = slot
        p.ds_stage3 = self
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        mark(p, shape, part.values, whole=False)

    # ------------------------------------------------------------------ the partitions
    @property
    def parts(self) -> list[torch.Tensor] | None:
        """The partitions as tensors (None when they are in files: use ``read_part``/``write_part``)."""
        return None if self.swap is not None else self._parts

    def read_part(self, g: int, lo: int, hi: int) -> torch.Tensor:
        """Elements ``[lo, hi)`` of this rank's partition of group ``g`` (a view, or a copy from the files)."""
        if self.swap is not None:
            return self.swap.read_range(g, lo, hi)
        return self._parts[g][lo:hi]

    def write_part(self, g: int, lo: int, hi: int, values: torch.Tensor, *, wait: bool = True) -> None:
        """Set elements ``[lo, hi)`` of this rank's partition of group ``g`` (no ``on_write`` call); with the
        partitions in files and ``wait=False`` the writes stay in flight until ``refresh_whole``."""
        if self.swap is not None:
            self.swap.write_range(g, lo, hi, values.detach(), wait=wait)
        else:
            with torch.no_grad():
                self._parts[g][lo:hi].copy_(values)

    def shares_storage(self, g: int, t: torch.Tensor) -> bool:
        """Whether ``t`` is group ``g``'s partition itself (fp32 weights are their own master)."""
        return self.swap is None and self._parts[g].data_ptr() == t.data_ptr()

    def _persists(self, numel: int) -> bool:
        threshold, model_threshold = self._persist_budget
        if numel > threshold or self.persistent_numel + numel > model_threshold:
            return False
        self.persistent_numel += numel
        return True

    # ------------------------------------------------------------------ lookup
    def slot(self, p: torch.Tensor) -> ParamSlot | None:
        """The slot of a managed parameter (None for parameters stage 3 does not partition)."""
        return self.slots.get(id(p))

    def slots_of(self, params: Iterable[torch.Tensor]) -> list[ParamSlot]:
        """Slots of the managed parameters among ``params``, without duplicates, in the given order."""
        seen, out = set(), []
        for p in params:
            s = self.slots.get(id(p))
            if s is not None and id(s) not in seen:
                seen.add(id(s))
                out.append(s)
        return out

    # ------------------------------------------------------------------ gather and release
    def gather(self, slots: Iterable[ParamSlot], *, wait: bool = True, exact: bool = False) -> None:
        """Make every slot's parameter whole (a no-op for those already whole), all of them in one batch of
        collectives (see ``_launch_gather``), or from the hpZ secondary partitions where they are valid.
        ``exact``: the primary partitions' values, never quantized (``GatheredParameters``).

        With ``wait=False`` (a prefetch) the batch stays in flight: the slots count as whole, and the
        next ``gather`` or ``release`` of a slot waits for its data first.
        """
        slots = list(slots)
        todo = sorted((s for s in slots if not s.gathered), key=lambda s: (s.group, s.start))
        homes = []
        for s in todo:
            homes.append(self._home(s).view(-1))
            s.param.data = s.home
            s.gathered = True
            set_status(s.param, ZeroParamStatus.INFLIGHT if not wait else ZeroParamStatus.AVAILABLE)
            if not s.persistent:
                self.live_numel += s.numel
        self.peak_live_numel = max(self.peak_live_numel, self.live_numel)
        works = self._launch_fetch(todo, homes, exact)
        if not wait:
            for s in todo:
                self._pending[id(s)] = works
            return
        for w in works:
            w.wait()
        self.settle(slots)

    def settle(self, slots: Iterable[ParamSlot]) -> None:
        """Wait for the prefetches still filling any of ``slots``."""
        for s in slots:
            for w in self._pending.pop(id(s), ()):
                w.wait()
            if s.gathered:
                set_status(s.param, ZeroParamStatus.AVAILABLE)

    def _launch_fetch(self, todo: list[ParamSlot], homes: list[torch.Tensor], exact: bool) -> list:
        """The works of a fetch: the partitions of frozen parameters (``_frozen``), secondary
        partitions where valid (hpZ), the primary ones for the rest."""
        frozen = [(s, h) for s, h in zip(todo, homes) if s.frozen is not None]
        if frozen:
            rest = [(s, h) for s, h in zip(todo, homes) if s.frozen is None]
            todo, homes = [s for s, _ in rest], [h for _, h in rest]
        return self._launch_frozen(frozen) + self._launch_trainable(todo, homes, exact)

    def _launch_frozen(self, pairs: list[tuple[ParamSlot, torch.Tensor]]) -> list:
        """Gather frozen slots into their flat outs (one all-gather of their payloads)."""
        if not pairs:
            return []
        if self.dp > 1:
            self.gather_calls += 1
            self.gathered_numel += sum(s.numel for s, _ in pairs)
        parts = [s.frozen for s, _ in pairs if s.frozen is not None]
        return launch_frozen_gather(parts, [h for _, h in pairs], self.process_group, self.dp)

    def _launch_trainable(self, todo: list[ParamSlot], homes: list[torch.Tensor], exact: bool) -> list:
        quantize_weights = self.quantize_weights and not exact
        if self.hpz is None or exact or self.dp == 1:
            return self._launch_gather(todo, None, homes, quantize_weights=quantize_weights)
        sec = [(s, h) for s, h in zip(todo, homes) if s.secondary is not None]
        prim = [(s, h) for s, h in zip(todo, homes) if s.secondary is None]
        works: list = []
        if sec:
            self.secondary_numel += sum(s.numel for s, _ in sec)
            works.append(self.hpz.launch([s.secondary for s, _ in sec], [h for _, h in sec]))
        if prim:
            hpz = self.hpz

            def keep() -> None:  # every rank of the hpz group keeps its chunk of what it gathered
                for s, h in prim:
                    if not s.persistent:
                        s.secondary = hpz.keep(h)

            primary = self._launch_gather([s for s, _ in prim], None, [h for _, h in prim],
                                          quantize_weights=quantize_weights)  # fmt: skip
            works.append(_Then(primary, keep))
        return works

    def gather_values(
        self, slots: Sequence[ParamSlot], sources: Sequence[torch.Tensor] | None, dtype: torch.dtype
    ) -> list[torch.Tensor]:
        """Full values of ``slots`` read from partitions of the same layout: ``sources`` (e.g. the fp32
        masters), or the weight partitions themselves (None)."""
        order = sorted(slots, key=lambda s: (s.group, s.start))
        bufs = {id(s): torch.empty(s.numel, dtype=dtype, device=s.param.device) for s in order}
        frozen = [s for s in order if s.frozen is not None]
        if frozen and sources is not None:
            raise ValueError(f"{frozen[0].name} is frozen: it has no partition in {dtype} sources")
        order = [s for s in order if s.frozen is None]
        works = self._launch_frozen([(s, bufs[id(s)]) for s in frozen])
        for w in works + self._launch_gather(order, sources, [bufs[id(s)] for s in order]):
            w.wait()
        return [bufs[id(s)].view(s.shape) for s in slots]

    def _home(self, s: ParamSlot) -> torch.Tensor:
        """The slot's full tensor with its storage allocated (contents undefined until gathered)."""
        p = s.param
        if s.home is None or s.home.dtype != p.dtype or s.home.device != p.device:
            s.home = torch.empty(s.shape, dtype=p.dtype, device=p.device)
        elif s.home.untyped_storage().nbytes() == 0:
            s.home.untyped_storage().resize_(s.numel * s.home.element_size())
        return s.home

    def _launch_gather(
        self,
        slots: Sequence[ParamSlot],
        sources: Sequence[torch.Tensor] | None,
        outs: Sequence[torch.Tensor],
        *,
        quantize_weights: bool = False,
    ) -> list:
        """Fill each ``outs[i]`` (flat, ``slots[i].numel`` elements; slots in flat order) with the slot's
        value from the partitions ``sources[group]`` (None: the weight partitions); returns the works to
        wait for.

        The local pieces are copied; the rest travels in one batch. A host transport (``_transport``) takes
        every owner's piece of every slot in one call (shared memory packs them into rounds). Else the
        slots are cut into runs that are contiguous in the flat space, and each run is one flat buffer
        filled by one broadcast per owner of a piece of it (``_comm``: the all-gather gloo does fastest),
        then copied into the outs; a run of one slot is broadcast straight into its out. With
        ``quantize_weights`` each owner's piece travels as int8 (``_quant``) over torch.distributed, and
        every rank, the owner too, takes the dequantized values.
        """
        if not slots:
            return []
        pieces: list[tuple[torch.Tensor, int]] = []
        for s, out in zip(slots, outs):
            self._copy_own(s, sources, out, s.start)
            for r, lo, hi in self.layouts[s.group].owners(s.start, s.end):
                pieces.append((out[lo - s.start : hi - s.start], r))
        if self.dp == 1:
            return []
        self.gathered_numel += sum(s.numel for s in slots)
        if not quantize_weights and _transport.transport(self.process_group, *(t for t, _ in pieces)):
            self.gather_calls += 1
            return broadcast_async(pieces, self.process_group)
        works: list = []
        for run in _runs(slots, outs):
            works.append(self._broadcast_run(run, quantize_weights))
        return works

    def _copy_own(
        self, s: ParamSlot, sources: Sequence[torch.Tensor] | None, dst: torch.Tensor, dst_start: int
    ) -> None:
        """Copy the elements of ``s`` this rank owns into the flat ``dst``, whose first element is element
        ``dst_start`` of the group's flat space (from the swap buffers when the partitions are in files)."""
        ps, pe = self.layouts[s.group].partition_range(self.rank)
        lo, hi = max(s.start, ps), min(s.end, pe)
        if lo >= hi:
            return
        if sources is None and self.swap is not None:
            dst[lo - dst_start : hi - dst_start].copy_(self.swap.piece(id(s.param)))
            self.swap.done(id(s.param))
            return
        src = (self._parts if sources is None else sources)[s.group]
        dst[lo - dst_start : hi - dst_start].copy_(src[lo - ps : hi - ps])

    def _broadcast_run(self, run: list[tuple[ParamSlot, torch.Tensor]], quantize_weights: bool = False):
        """One run of flat-contiguous slots over torch.distributed (see ``_launch_gather``)."""
        g, start, end = run[0][0].group, run[0][0].start, run[-1][0].end
        if len(run) == 1:
            buf = run[0][1]
        else:
            buf = torch.empty(end - start, dtype=run[0][1].dtype, device=run[0][1].device)
            ps, pe = self.layouts[g].partition_range(self.rank)
            for s, out in run:  # this rank's elements, already in the outs (``_launch_gather``)
                lo, hi = max(s.start, ps), min(s.end, pe)
                if lo < hi:
                    buf[lo - start : hi - start].copy_(out[lo - s.start : hi - s.start])
        pieces = [(buf[lo - start : hi - start], r) for r, lo, hi in self.layouts[g].owners(start, end)]
        self.gather_calls += len(pieces)
        wire = _quantized(pieces, self.rank) if quantize_weights else pieces
        if quantize_weights:
            group = self.process_group
            works = [
                dist.broadcast(t, src=global_rank(group, r), group=group, async_op=True) for t, r in wire
            ]
        else:
            works = broadcast_async(pieces, self.process_group)
        if len(run) == 1 and not quantize_weights:
            return _Then(works, None)

        def unpack() -> None:
            if quantize_weights:
                for (t, _), (payload, _) in zip(pieces, wire):
                    t.copy_(dequantize(payload, t.numel(), WEIGHT_BITS, WEIGHT_BLOCK))
            if len(run) > 1:
                for s, out in run:
                    out.copy_(buf[s.start - start : s.end - start])

        return _Then(works, unpack)

    def release(self, slots: Iterable[ParamSlot]) -> None:
        """Drop the full tensors of slots nobody uses (persistent parameters stay whole)."""
        for s in slots:
            if s.gathered and not s.persistent and s.fwd_users == 0 and not s.bwd_hold and s.pins == 0:
                self.settle([s])  # a broadcast still writing into the buffer must finish first
                s.param.data = torch.empty(0, dtype=s.param.dtype, device=s.param.device)
                if s.home is not None:  # frees it for the views autograd saved of it too
                    s.home.untyped_storage().resize_(0)
                s.gathered = False
                set_status(s.param, ZeroParamStatus.NOT_AVAILABLE)
                self.live_numel -= s.numel

    def refresh_whole(self) -> None:
        """After the partitions changed (a step, a load): re-gather what must stay whole, release the rest.

        Persistent and pinned parameters are gathered anew; any other whole parameter is stale, so its
        forward/backward holds are dropped (no forward or backward is running between steps). Writes to
        the swap files left in flight by the step are waited for first.
        """
        if self.swap is not None:
            self.swap.flush()
        whole = [s for s in self.slots.values() if s.persistent or s.pins > 0]
        for s in self.slots.values():
            s.fwd_users, s.bwd_hold = 0, False
            s.secondary = None  # the partitions changed
        self.release(self.slots.values())
        for s in whole:
            if s.gathered and not s.persistent:
                self.live_numel -= s.numel
            s.gathered = False
        self.gather(whole)

    def write_back(self, slot: ParamSlot, full: torch.Tensor) -> None:
        """Copy this rank's part of the full value ``full`` into its partition (and tell ``on_write``)."""
        if slot.frozen is not None:  # encoded again; no master to tell
            slot.frozen.write(full.detach())
            self.settle([slot])
            if slot.gathered and full.data_ptr() != slot.param.data_ptr():
                slot.param.data.copy_(full.reshape(slot.shape))
            return
        layout = self.layouts[slot.group]
        ps, pe = layout.partition_range(self.rank)
        lo, hi = max(slot.start, ps), min(slot.end, pe)
        if lo < hi:
            flat = full.reshape(-1)
            self.write_part(slot.group, lo - ps, hi - ps, flat[lo - slot.start : hi - slot.start])
            if self.on_write is not None:
                self.on_write(slot.group, lo - ps, hi - ps)
        self.settle([slot])
        slot.secondary = None  # the partitions changed
        if slot.gathered and full.data_ptr() != slot.param.data_ptr():
            slot.param.data.copy_(full.reshape(slot.shape))

    def numel_held(self) -> int:
        """Elements of this rank's partitions plus the whole (persistent) parameters it keeps."""
        held = self.swap.cpu_numel if self.swap is not None else sum(self.part_numels)
        return held + sum(s.numel for s in self.slots.values() if s.persistent)


def _make_whole(p: nn.Parameter) -> None:
    """A parameter cut by ``zero.Init`` that stage 3 does not manage: whole again (collective)."""
    shape = source_shape(p)
    p.data = full_value(p).view(shape)
    forget_construction(p)
    mark(p, shape, p.data, whole=True)


def _quantized(pieces: list[tuple[torch.Tensor, int]], rank: int) -> list[tuple[torch.Tensor, int]]:
    """Each ``(piece, owner)`` as its int8 payload: quantized on the owner, an empty buffer elsewhere."""
    out = []
    for t, r in pieces:
        if r == rank:
            out.append((quantize(t, WEIGHT_BITS, WEIGHT_BLOCK), r))
        else:
            n = payload_bytes(t.numel(), WEIGHT_BITS, WEIGHT_BLOCK)
            out.append((torch.empty(n, dtype=torch.uint8, device=t.device), r))
    return out


def _runs(
    slots: Sequence[ParamSlot], outs: Sequence[torch.Tensor]
) -> list[list[tuple[ParamSlot, torch.Tensor]]]:
    """``slots`` (in flat order) with their outs, cut where the next slot does not continue the flat range
    of the previous one in the same group, dtype and device."""
    runs: list[list[tuple[ParamSlot, torch.Tensor]]] = []
    for s, out in zip(slots, outs):
        last = runs[-1][-1] if runs else None
        if (
            last is not None
            and last[0].group == s.group
            and last[0].end == s.start
            and (last[1].dtype, last[1].device) == (out.dtype, out.device)
        ):
            runs[-1].append((s, out))
        else:
            runs.append([(s, out)])
    return runs
