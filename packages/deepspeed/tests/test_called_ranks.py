"""At two gloo ranks, as DeepSpeed 0.19.8 answered for ``fixtures/deepspeed_called.json``
(``tools/fixtures/make_deepspeed_called_fixtures.py``, cases in ``tools/fixtures/deepspeed_called_cases.py``):
``deepspeed.comm``'s allgather_fn, reduce_scatter_fn, inference_all_reduce, monitored_barrier, get_local_rank,
get_world_group and get_global_rank; the Ulysses state of ``parallel_state_sp`` and ``single_all_to_all``;
``deepspeed.moe.utils``' parameter splitting around a real MoE layer; the pipeline engine's PipelineError for
forward, backward and step. One launch runs every part on both ranks; the asserts run here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rank_testing import spawn

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_called.json").read_text())
FIXTURES = str(Path(__file__).resolve().parents[3] / "tools/fixtures")
sys.path.insert(0, FIXTURES)
import deepspeed_called_cases as cases  # noqa: E402

KNOWN = {
    "comm/inference_all_reduce": (
        "not recorded: DeepSpeed 0.19.8's CPU inference all-reduce (its shared-memory op) killed the rank with "
        "SIGSEGV; ds's is an all-reduce (checked below)"
    ),
    "sequence/again": (
        "a second initialize_sequence_parallel of the same size returns the job's one topology in ds; DeepSpeed "
        "asserts (a different size raises ds_engine's TopologyError)"
    ),
}


def _rank(rank: int, world_size: int) -> dict:
    sys.path.insert(0, FIXTURES)
    import deepspeed_called_cases
    from ds_engine.topology import reset_topology

    # one job has one parallel topology in ds; the parts want three (sequence 2, expert 2, pipe 2)
    return json.loads(json.dumps(deepspeed_called_cases.ranks_case(rank, world_size, reset_topology)))


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn(_rank, 2, timeout_s=300)


@pytest.mark.parametrize("part", ["comm", "sequence", "moe", "pipeline"])
def test_answers_as_deepspeed(ranks, part):
    known = {k: v for k, v in KNOWN.items() if k.startswith(f"{part}/")}
    for rank, got in enumerate(ranks):
        differing: set[str] = set()
        assert cases.compare(RECORD["ranks"][rank][part], got[part], part, known, differing) == [], rank
        assert differing == set(known), f"no longer different: {set(known) - differing}"


def test_inference_all_reduce_reduces(ranks):
    for got in ranks:
        assert got["comm"]["inference_all_reduce"] == [[3.0], [2.0]]  # SUM of 1 and 2; MAX
