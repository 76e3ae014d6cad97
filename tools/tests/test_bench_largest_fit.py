"""tools/bench/bench_largest_fit.py: the RSS watchdog kills a run over budget, failures are judged alike, and the
climb stops at the first failure (bisecting once when asked)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools" / "bench"), str(ROOT / "testing")]
from _rank_watchdog import GIB, run_watched  # noqa: E402

PY = sys.executable


def _watch(tmp_path: Path, *codes: str, budget_gib: float = 4.0, timeout_s: float = 60) -> tuple:
    return run_watched(
        [[PY, "-c", c] for c in codes], dict(os.environ), tmp_path, int(budget_gib * GIB), timeout_s
    )


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_watchdog_kills_every_rank_when_the_total_passes_the_budget(tmp_path: Path) -> None:
    """Two ranks of 200 MiB each pass a 0.3 GiB budget together (neither alone would): both are killed."""
    grow = "import os, time; print(os.getpid(), flush=True); x = bytearray(200 * 2**20); time.sleep(60)"
    outcome, oom = _watch(tmp_path, grow, grow, budget_gib=0.3)
    assert not outcome.ok and oom
    assert "passed the budget 0.30 GiB: killed by the watchdog" in outcome.reason
    assert outcome.peak_total_rss_bytes > 0.3 * GIB
    assert outcome.wall_s < 30  # killed, not waited for
    pids = [int((tmp_path / f"rank{r}.out").read_text()) for r in range(2)]
    assert not any(_alive(p) for p in pids)


def test_watchdog_ends_the_run_when_one_rank_dies_and_says_why(tmp_path: Path) -> None:
    """A rank's MemoryError is out of memory; the other rank (stuck, as in a collective) is killed too."""
    outcome, oom = _watch(tmp_path, "raise MemoryError('x')", "import time; time.sleep(60)")
    assert (outcome.ok, oom) == (False, True)
    assert outcome.reason == "rank 0: MemoryError: x"
    assert outcome.wall_s < 30


@pytest.mark.parametrize(
    "code, reason, oom",
    [
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL", True),
        (
            "raise RuntimeError('DefaultCPUAllocator: can\\'t allocate memory: 9 bytes')",
            "RuntimeError: Default",
            True,
        ),
        (
            "raise ValueError('a bug')",
            "exit code 1: ValueError: a bug",
            False,
        ),  # not a size that does not fit
    ],
)
def test_failures_are_classified_alike(tmp_path: Path, code: str, reason: str, oom: bool) -> None:
    outcome, is_oom = _watch(tmp_path, code)
    assert reason in outcome.reason and is_oom is oom


@pytest.mark.timeout(600)
def test_the_climb_stops_at_the_first_failure_and_bisects_once(tmp_path: Path) -> None:
    """DDP at 2 ranks: 1 layer fits in 1.6 GiB of total RSS, 24 layers (76M parameters, 16 bytes each per
    rank) do not; --bisect then tries 12 layers once. Real ranks, real training steps."""
    pytest.importorskip("torch", reason="the ranks train: this runs in the integration session")
    out = tmp_path / "fit.json"
    cmd = [PY, str(ROOT / "tools" / "bench" / "bench_largest_fit.py"), "--impls", "ddp", "--world", "2", "--width", "512",
           "--heads", "8", "--vocab", "1000", "--seq", "16", "--layers", "1,24,48", "--budget-gib", "1.6",
           "--bisect", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rungs = {r["layers"]: r for r in report["rungs"]}
    assert list(rungs) == [1, 24, 12]  # 48 is never tried: the climb stopped at 24
    assert rungs[1]["status"] == "ok" and len(rungs[1]["step_s"]) == 3
    assert rungs[1]["peak_total_rss_gib"] > 0
    assert rungs[24]["status"] == "fail" and "killed by the watchdog" in rungs[24]["reason"]
    per_layer = (rungs[24]["params"] - rungs[12]["params"]) // 12
    assert per_layer == 12 * 512**2 + 13 * 512 and rungs[12]["params"] - rungs[1]["params"] == 11 * per_layer
    assert report["largest"]["ddp"]["layers"] == max(n for n, r in rungs.items() if r["status"] == "ok")
    assert "| ddp |" in proc.stdout


def _built_bytes(rank: int, world: int, impl: str, stage: int) -> dict:
    """Live tensor bytes that building the ``small`` GPT adds on this rank, as the fit search builds it."""
    from _bench_cases import MODELS, build_model
    from _bench_memory import live_tensor_bytes

    before = live_tensor_bytes()
    model = build_model({"impl": impl, "stage": stage, "dtype": "fp32"}, MODELS["small"])
    return {"added": live_tensor_bytes() - before, "meta": all(p.is_meta for p in model.parameters())}


# (implementation, ZeRO stage, the share of the whole model a rank may hold once it is built)
BUILT = [("ds", 3, 0.6), ("fsdp2", 0, 0.0), ("ddp", 0, 1.0)]


def _built_bytes_each(rank: int, world: int) -> dict:
    """Every implementation of BUILT, one after the other in one spawn (spawning is the expensive part)."""
    import gc

    out = {}
    for impl, stage, _ in BUILT:
        out[impl] = _built_bytes(rank, world, impl, stage)  # the model is dropped on return
        gc.collect()
    return out


@pytest.mark.timeout(300)
def test_models_are_built_as_each_implementation_builds_them() -> None:
    """ds stage 3 inside zero.Init holds about its 1/2 partition (plus small persistent parameters) on each
    of 2 ranks; FSDP2 starts on the meta device (no bytes until its shards); DDP holds the whole model."""
    pytest.importorskip("ds_engine", reason="builds ds models: runs in the integration session")
    from _bench_cases import MODELS
    from rank_testing import spawn

    d = MODELS["small"]
    whole = 4 * (
        d.vocab * d.width + d.seq * d.width + d.layers * (12 * d.width**2 + 13 * d.width) + 2 * d.width
    )
    results = spawn(_built_bytes_each, 2, timeout_s=250)
    for impl, _, share in BUILT:
        for r in (ranks[impl] for ranks in results):
            assert r["meta"] is (impl == "fsdp2"), impl
            assert r["added"] <= share * whole + 2**16, (impl, r)
            assert r["added"] >= (0.45 * whole if impl != "fsdp2" else 0), (impl, r)


@pytest.mark.parametrize("impl", ["ds", "fsdp2"])
def test_checkpoint_activations_recomputes_every_block_in_backward(impl: str) -> None:
    """--checkpoint-activations: each block's forward starts again during backward (once without it)."""
    pytest.importorskip("ds_engine")
    import torch
    from _bench_cases import MODELS, make_model
    from bench_largest_fit import set_checkpointing

    calls = {}
    for flag in (False, True):
        model = make_model(MODELS["tiny"])
        set_checkpointing(model, {"impl": impl, "stage": 3, "checkpoint_activations": flag})
        seen: list[int] = []
        for block in model.blocks:
            block.register_forward_pre_hook(
                lambda *_, seen=seen: seen.append(1)
            )  # torch stops a recompute early
        idx = torch.randint(0, 1024, (2, 64))
        model(idx, idx).backward()
        calls[flag] = len(seen)
    assert calls == {False: 2, True: 4}
