"""Every parity configuration of stages 0-3 on one rank, with how many collectives a host transport
carried (``_transport.py``), and the checks of those results: shared by the MPI and shared-memory tests."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import _stage3_workers as s3
import _workers as w
import torch

FP32_TOL = 2e-6
BF16 = {c["name"] for c in w.CONFIGS if "dtype" in c}
# The baseline run over torch.distributed that a transport's weights are compared with bit for bit: one
# configuration per collective a transport carries (all-reduce, reduce-scatter, all-gather, broadcast, the
# bucketed and overlapped paths, offload) and stage 3; the transport's own run covers every configuration.
BASELINE = {"s0_overlap", "s1_contig_bcast", "s1_overlap_offload", "s2_overlap_contig", "s2_allreduce_predivide",
            "s2_offload_bcast", "s2_bf16", "stage3"}  # fmt: skip


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def run_all(rank: int, world: int, calls: Callable[[], int], baseline: bool = False) -> dict:
    """Per configuration (``BASELINE``'s only if ``baseline``): max weight difference from single-process
    training, a digest of the trained weights and how many collectives ``calls()`` counted meanwhile; the
    same for stage 3's check."""
    out: dict = {}
    data = w.make_data(world)
    for cfg in w.CONFIGS:
        if baseline and cfg["name"] not in BASELINE:
            continue
        ref = w.reference(cfg, world, data)
        before = calls()
        model = w.train_stage0(rank, cfg, data) if cfg["stage"] == 0 else w.train_zero(rank, cfg, data)[0]
        out[cfg["name"]] = {
            "diff": w.max_diff(model, ref),
            "digest": digest(model.state_dict()),
            "calls": calls() - before,
        }
    before = calls()
    errors = s3.parity(rank, world)
    out["stage3"] = {"diff": max(errors.values()), "digest": json.dumps(errors), "calls": calls() - before}
    return out


def same_weights(transport: dict, baseline: dict) -> bool:
    """The transport's run trained the baseline configurations to the same bits as torch.distributed."""
    assert set(baseline) == BASELINE, sorted(baseline)
    return {k: transport[k]["digest"] for k in baseline} == {k: r["digest"] for k, r in baseline.items()}


def check(ranks: list[dict], carried: Callable[[str], bool], transport: str) -> None:
    """Every configuration matches single-process training, every rank holds the same weights, and the
    transport carried the configurations ``carried(name)`` says it should (and no others)."""
    for name in ranks[0]:
        tol = 0.03 if name in BF16 else FP32_TOL
        for rank, result in enumerate(ranks):
            r = result[name]
            assert r["diff"] <= tol, f"{name} rank {rank}: max weight difference {r['diff']}"
            assert r["digest"] == ranks[0][name]["digest"], (
                f"{name}: rank {rank}'s weights differ from rank 0's"
            )
            assert (r["calls"] > 0) == carried(name), f"{name} rank {rank}: {r['calls']} {transport} calls"
