"""A DeepSpeed-MoE script (integration/scripts/moe/moe_train.py) run unchanged by ds's ``deepspeed`` launcher
at the session's world size (2 in CI, 4 in `integration(world_size=4)`): every case's per-rank losses and
auxiliary losses (and, where DeepSpeed computed one, the global gradient norm) equal DeepSpeed 0.19.8's run
of it (integration/fixtures/deepspeed_moe/, recorded by tools/fixtures/make_moe_fixtures.py), every fixture of
the world size in one launch: ``world<N>.json`` at ZeRO stage 0, ep 1, 2 (and 4), top-1 and top-2, with and
without token dropping; ``world<N>-zero.json`` at ZeRO stages 1 and 2 with expert parallelism (ep 2 at world
2 and 4, ep 4 at world 4), fp32 and bf16, AdamW and SGD with clipping, and stage 0 with clipping (DeepSpeed's
stage-0 norms with experts). The losses after the first step depend
on the expert gradients being reduced over the expert-data-parallel group, at ZeRO on the experts being
partitioned over it and averaged over the data-parallel world, and with clipping on the norm counting every
expert once (each seen failing with that part unwired)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import world_size

HERE = Path(__file__).parent
SCRIPT = HERE / "scripts" / "moe" / "moe_train.py"
FIXTURES = HERE / "fixtures" / "deepspeed_moe"
REL_TOL = {"fp32": 1e-5, "bf16": 1e-2}  # bf16: integration/test_engine_parity.py's bound (summation order)


def _run(world: int, script_args: list[str]) -> dict[str, list[dict]]:
    found = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    exe = [found] if found else [sys.executable, "-m", "deepspeed.launcher.runner"]
    cmd = [*exe, "--num_gpus", str(world), str(SCRIPT), *script_args]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    cases: dict[str, list[dict]] = {}
    for line in proc.stdout.splitlines():
        start = line.find('{"case"')
        if start >= 0:
            r = json.loads(line[start:])
            cases.setdefault(r.pop("case"), []).append(r)
    return cases


def _fixtures() -> list[dict]:
    """The fixtures of this session's world size: world 2 in CI, world 4 in the 4-rank session."""
    paths = [FIXTURES / f"world{world_size()}{suffix}.json" for suffix in ("", "-zero")]
    return [json.loads(p.read_text()) for p in paths if p.exists()]


@pytest.fixture(scope="module")
def runs() -> tuple[list[dict], dict]:
    """Every case of every fixture of this world size in one launch (CI time: a launch is mostly start-up).
    Each case builds its own model and engine from its own seeds, so a case gives the same numbers alone
    (as recorded) or among others; the fixtures' own product flags (``--ep/--k/--drop``) name the same cases."""
    fixtures = _fixtures()
    if not fixtures:
        pytest.skip(
            f"DeepSpeed's MoE losses are recorded in {sorted(p.stem for p in FIXTURES.glob('world*.json'))}"
        )
    for f in fixtures:  # nothing but the choice of cases may differ between the fixtures' commands
        flags = set(f["script_args"][::2])
        assert flags in ({"--cases"}, {"--ep", "--k", "--drop"}), f["script_args"]
    cases = [c for f in fixtures for c in f["cases"]]
    return fixtures, _run(world_size(), ["--cases", ",".join(cases)])


def test_losses_and_aux_losses_equal_deepspeeds(runs):
    fixtures, ours = runs
    assert sorted(ours) == sorted(c for f in fixtures for c in f["cases"])
    for fixture in fixtures:
        assert fixture["deepspeed_version"] == "0.19.8" and fixture["world"] == world_size()
        _compare(fixture, ours)


def _compare(fixture: dict, ours: dict[str, list[dict]]) -> None:
    for case, theirs in fixture["cases"].items():
        assert len(ours[case]) == len(theirs), case
        tol = REL_TOL["bf16" if "-bf16" in case else "fp32"]
        for mine, want in zip(ours[case], theirs):
            for key in ("loss", "l_aux"):
                for a, b in zip(mine[key], want[key], strict=True):
                    assert abs(a - b) <= tol * abs(b), (
                        f"{case} step {want['step']} {key}: ds {a}, DeepSpeed {b}"
                    )
            if want.get("grad_norm") is not None:  # the norm DeepSpeed clips with
                a, b = mine["grad_norm"], want["grad_norm"]
                assert a is not None and abs(a - b) <= tol * abs(b), (
                    f"{case} step {want['step']} grad_norm: ds {a}, DeepSpeed {b}"
                )
