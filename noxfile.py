"""Sessions for the ds monorepo. `nox -l` lists them; `nox -s tests` runs everything CI needs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox
import nox.virtualenv

# --- constants -------------------------------------------------------------------------------------
ROOT = Path(__file__).parent
TORCH = "torch==2.13.0"  # the test environments' torch; the packages themselves accept a range
# Machines of this project keep the CPU build of that torch on disk; installing the file itself keeps uv
# from choosing a multi-GB CUDA build from the index.
LOCAL_TORCH_WHEELS = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"))
TEST_DEPS = ["pytest>=8", "pytest-timeout", "pytest-xdist", "hypothesis>=6", "numpy"]
# Package and kernel suites are mostly one-process tests: two pytest workers keep both CI cores busy.
# Package suites go file by file (loadfile): several files share one module-scoped multi-rank run among
# their tests, which a worker would repeat if the file were split (xdist 3.8's loadgroup does not group
# under pytest 9). The kernels are one file of independent tests: test by test.
PARALLEL = ["-n", "2", "--dist", "loadfile"]
# package -> (its internal dependencies, extras its tests exercise)
PACKAGES: dict[str, tuple[list[str], list[str]]] = {
    "ds-config": ([], []),
    "ds-precision": (["ds-config"], ["fast"]),
    "ds-zero": (["ds-config"], ["mpi"]),
    "ds-optim": (["ds-config"], ["mpi", "fast"]),
    "ds-checkpoint": (["ds-config"], []),
    "ds-sparse-attn": (["ds-config"], ["plot"]),
    "ds-launch": (["ds-config"], ["mpi"]),
    "ds-pipe": (["ds-config"], []),
    "ds-tpsp": (["ds-config"], ["hf"]),
    "ds-moe": (["ds-config"], []),
    "ds-engine": (
        ["ds-config", "ds-precision", "ds-zero", "ds-optim", "ds-checkpoint", "ds-sparse-attn", "ds-launch",
         "ds-tpsp", "ds-pipe", "ds-moe"],
        ["tensorboard"],
    ),
    # DeepSpeed's module paths (import deepspeed) over ds-engine: for Trainer, Accelerate, Lightning
    "deepspeed": (
        ["ds-config", "ds-precision", "ds-zero", "ds-optim", "ds-checkpoint", "ds-sparse-attn", "ds-launch",
         "ds-tpsp", "ds-pipe", "ds-moe", "ds-engine"],
        [],
    ),
}
WORLD_SIZES = [1, 2, 4]
PER_TEST_TIMEOUT_S = "600"

nox.options.default_venv_backend = "uv|venv"
# uv installs without compiling .pyc files; where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines) every rank process then compiles torch's and ds's sources again at import: about 5 s of CPU a
# process, measured (`import ds_engine`: 8.4-9.0 s user without .pyc, 3.5-4.1 s with, on 2 busy cores).
# Compiling once at install is a few seconds a session; the tests start hundreds of processes.
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")
nox.options.sessions = ["tests"]


def _local(name: str, extras: list[str] | None = None) -> str:
    extra = f"[{','.join(extras)}]" if extras else ""
    return f"{ROOT / 'packages' / name}{extra}"


def _install(session: nox.Session, names: list[str], extras: dict[str, list[str]] | None = None) -> None:
    """Install torch (unless only ds-config is asked for: it must work without), then the named packages."""
    torch = [str(LOCAL_TORCH_WHEELS[-1]) if LOCAL_TORCH_WHEELS else TORCH] if names != ["ds-config"] else []
    session.install(*torch, *TEST_DEPS)
    session.install(*[_local(n, (extras or {}).get(n)) for n in names])


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


# --- sessions --------------------------------------------------------------------------------------
@nox.session(name="pkg")
@nox.parametrize("package", list(PACKAGES))
def package_tests(session: nox.Session, package: str) -> None:
    """One package's tests with only it (and what it declares) installed into a fresh environment."""
    deps, extras = PACKAGES[package]
    _install(session, [*deps, package], {package: extras})
    session.run(
        "python",
        "-m",
        "pytest",
        f"packages/{package}/tests",
        "-q",
        "-rfEs",  # each failure by name, then the reason for every skip (no GPU, no mpirun, another world size)
        "--durations=8",  # the slowest tests, for whoever trims CI time next
        *PARALLEL,
        f"--timeout={PER_TEST_TIMEOUT_S}",
        "-p",
        "no:cacheprovider",
        *session.posargs,
    )


@nox.session
def kernels(session: nox.Session) -> None:
    """Sparse-attention kernel tests under Numba's CUDA simulator (and on a GPU when one is present)."""
    _install(session, ["ds-config", "ds-sparse-attn"], {"ds-sparse-attn": ["cuda"]})
    session.run(
        "python",
        "-m",
        "pytest",
        "kernels",
        "-q",
        "-rfEs",  # each failure by name, then the reason for every skip (no GPU, no mpirun, another world size)
        "-n",
        "2",
        f"--timeout={PER_TEST_TIMEOUT_S}",
        *session.posargs,
        env={"NUMBA_ENABLE_CUDASIM": "0" if _gpu_count() else "1"},
    )


@nox.session
@nox.parametrize("world_size", WORLD_SIZES)
def integration(session: nox.Session, world_size: int) -> None:
    """Multi-package, multi-rank tests at one world size (gloo on CPU; one rank per GPU over nccl)."""
    gpus = _gpu_count()
    if gpus and world_size > gpus:
        session.skip(f"world size {world_size} needs {world_size} GPUs, found {gpus}")
    _install(session, list(PACKAGES), {"ds-launch": ["mpi"], "ds-sparse-attn": ["plot"]})
    session.run(
        "python",
        "-m",
        "pytest",
        "integration",
        "--ignore=integration/frameworks",  # their own session: they need the frameworks installed
        # the training benchmarks' own tests need every package; run them once, at 2 ranks
        *(
            [
                "tools/tests/test_bench_training.py",
                "tools/tests/test_bench_largest_fit.py",
                "tools/tests/test_gpu_tools.py",  # the GPU checks' plumbing, on CPU
                "testing/test_hosts.py",  # the namespace test hosts the multi-host tests run on
            ]
            if world_size == 2
            else []
        ),
        "-q",
        "-rfEs",  # each failure by name, then the reason for every skip (no GPU, no mpirun, another world size)
        "--durations=15",  # the slowest tests, for whoever trims CI time next
        # at 2 ranks two test files at a time: much of a launch is imports and rendezvous, not compute
        *(PARALLEL if world_size == 2 else []),
        f"--timeout={PER_TEST_TIMEOUT_S}",
        *session.posargs,
        env={"DS_TEST_WORLD_SIZE": str(world_size)},
    )


# The frameworks that import deepspeed themselves, pinned to the releases their tests were recorded against
FRAMEWORKS = ["transformers==5.25.0", "accelerate==1.16.0", "lightning==2.6.6"]


@nox.session
def frameworks(session: nox.Session) -> None:
    """Hugging Face Trainer, Accelerate and Lightning, unmodified, at 2 ranks on ds's `deepspeed` package,
    against DeepSpeed 0.19.8's recorded losses (integration/frameworks/fixtures, made by
    tools/fixtures/make_framework_fixtures.py)."""
    _install(session, list(PACKAGES), {"ds-launch": ["mpi"]})
    session.install(*FRAMEWORKS)
    session.run(
        "python",
        "-m",
        "pytest",
        "integration/frameworks",
        "-q",
        "-rfEs",
        "--durations=15",
        # one framework per worker: the launches are mostly waiting (Lightning's launcher, rendezvous)
        *PARALLEL,
        f"--timeout={PER_TEST_TIMEOUT_S}",
        "-p",
        "no:cacheprovider",
        *session.posargs,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")


@nox.session
def docs(session: nox.Session) -> None:
    """Package contracts (no sibling imports, no import circle inside a package, lock-step versions, a consumer
    for every config key), the reference."""
    session.install("pytest", "pytest-timeout", "pydantic>=2.6,<3", _local("ds-config"))
    session.run("python", "tools/checks/check_deps.py")
    session.run("python", "tools/checks/check_import_cycles.py")
    session.run("python", "tools/checks/gen_config_reference.py", "--check")
    session.run("python", "tools/checks/check_config_consumers.py")
    session.run("python", "-m", "pytest", "tools/tests", "-q", "-rfEs")


@nox.session(venv_backend="none")
def build(session: nox.Session) -> None:
    """Every package's wheel and sdist into dist/; each wheel installs alone from there and imports (not in
    `tests`: about 5 minutes on 2 cores); ds-sparse-attn's README line from a clone works without ds-engine."""
    found, uv, _ = nox.virtualenv.find_uv()
    if not found:
        session.error("`nox -s build` needs uv next to nox: run it as `./dev -s build`")
    # nox's own interpreter (the clone's .venv under ./dev): the script needs only the standard library
    session.run(sys.executable, "tools/packaging/build_packages.py", "--uv", uv, "--out", "dist", *session.posargs, external=True)


@nox.session
def train(session: nox.Session) -> None:
    """The main job: a real 2-rank training run of a small GPT on built-in defaults (args pass through)."""
    _install(session, list(PACKAGES), {"ds-sparse-attn": ["plot"]})
    session.run(
        "ds-launch",
        "--num_procs",
        os.environ.get("DS_NUM_PROCS", "2"),
        "examples/train_gpt.py",
        *session.posargs,
    )


@nox.session
def tests(session: nox.Session) -> None:
    """Everything CI runs: lint, docs, each package alone, kernels, integration at 2 ranks, frameworks."""
    for name in [
        "lint",
        "docs",
        *[f"pkg(package='{p}')" for p in PACKAGES],
        "kernels",
        # CI time: 2 ranks only. One rank is what ds-engine's own tests run; 4 ranks are the package suites'
        # 4-rank tests, the frameworks' 4-rank resumes and the 2-rank session's 4-rank resume
        # (test_engine_parity.py); `./dev -s "integration(world_size=4)"` runs the whole suite at 4
        "integration(world_size=2)",
        "frameworks",
    ]:
        session.notify(name)
