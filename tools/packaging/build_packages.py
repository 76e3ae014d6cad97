"""Build every package's wheel and sdist into one folder, then prove each wheel installs alone.

    python tools/packaging/build_packages.py [--out dist] [--uv PATH] [--only NAME ...] [--skip-build]

1. ``uv build`` makes ``<out>/<name>-<version>.tar.gz`` and the wheel built from that sdist (so a file
   missing from the sdist fails here), for every folder under ``packages/``.
2. For each wheel, a fresh venv gets the wheel's third-party requirements from the index (torch from
   the machine's CPU wheel in /opt/wheels when there is one: the index's torch is a multi-GB CUDA build),
   then the package itself with ``--no-index --find-links <out>``: its ds siblings can come from that
   folder only, never from an index. The check then imports the package and asserts that the ds
   packages installed are exactly it and the ds packages its metadata declares (ds-sparse-attn
   installs without ds-engine).
3. The from-a-clone line of ds-sparse-attn's README, ``pip install ./packages/ds-config
   ./packages/ds-sparse-attn``, run by pip in a fresh venv, gives a ds_sparse_attn that computes
   block-sparse attention (forward and backward) with no ds-engine installed.

Exits non-zero naming the first package that fails. The venvs live in a temporary folder.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ROOT / "packages"
LOCAL_TORCH_WHEELS = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"))
SPARSE_README_LINE = ["./packages/ds-config", "./packages/ds-sparse-attn"]
# Block-sparse attention forward and backward, and no ds-engine: what the README line must give.
SPARSE_SMOKE = """
import importlib.util, torch
from ds_sparse_attn import FixedSparsityConfig, SparseSelfAttention
config = FixedSparsityConfig(num_heads=2, block=16, num_local_blocks=2, num_global_blocks=1)
q = k = v = torch.randn(1, 2, 64, 16, requires_grad=True)  # (batch, heads, seq, head_dim)
out = SparseSelfAttention(config, max_seq_length=64)(q, k, v)
out.sum().backward()
assert out.shape == (1, 2, 64, 16) and q.grad is not None
assert importlib.util.find_spec("ds_engine") is None, "ds_engine is installed too"
print("ds_sparse_attn works without ds_engine")
"""


class CheckFailed(Exception):
    pass


def _run(cmd: list[str], cwd: Path = ROOT) -> str:
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise CheckFailed(
            f"`{' '.join(cmd)}` exited with {res.returncode}:\n{res.stdout[-2000:]}{res.stderr[-4000:]}"
        )
    return res.stdout


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build(uv: str, out: Path, names: list[str]) -> None:
    if out.exists():
        shutil.rmtree(out)  # a wheel of an older version would be found by --find-links
    for name in names:
        start = time.monotonic()
        _run([uv, "build", "--quiet", "--out-dir", str(out), str(PACKAGES / name)])
        print(f"build: {name}: wheel and sdist in {time.monotonic() - start:.0f} s", flush=True)


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """(name, version, every Requires-Dist line) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        path = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(path).decode()
    headers = [line.split(": ", 1) for line in text.split("\n\n", 1)[0].splitlines() if ": " in line]
    name = next(value for key, value in headers if key == "Name")
    version = next(value for key, value in headers if key == "Version")
    return name, version, [value for key, value in headers if key == "Requires-Dist"]


def _requirement_name(requirement: str) -> str:
    return _normal(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0])


def _requirement_extras(requirement: str) -> set[str]:
    found = re.match(r"[^\[;]*\[([^\]]*)\]", requirement)
    return {e.strip() for e in found.group(1).split(",")} if found else set()


def _applies(requirement: str, extras: set[str]) -> tuple[bool, str]:
    """Whether ``requirement`` holds with ``extras`` chosen, and the requirement without its extra marker."""
    spec, _, marker = requirement.partition(";")
    extra = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)
    if extra is None:
        return True, requirement
    return extra.group(1) in extras, spec.strip()


def closure(name: str, out: Path, ours: set[str]) -> tuple[set[str], list[str]]:
    """The ds packages ``name`` brings (itself included) and every third-party requirement among them."""
    found: set[str] = set()
    third_party: set[str] = set()
    todo: list[tuple[str, set[str]]] = [(_normal(name), set())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        current, extras = todo.pop()
        if (current, frozenset(extras)) in seen:
            continue
        seen.add((current, frozenset(extras)))
        found.add(current)
        wheel = next(out.glob(f"{current.replace('-', '_')}-*.whl"))
        for requirement in wheel_metadata(wheel)[2]:
            holds, plain = _applies(requirement, extras)
            if not holds:
                continue
            if _requirement_name(plain) in ours:
                todo.append((_requirement_name(plain), _requirement_extras(plain)))
            else:
                third_party.add(plain)
    return found, sorted(third_party)


def _import_name(dist_name: str) -> str:
    return dist_name.replace("-", "_")


def _venv(uv: str, where: Path, seed_pip: bool = False) -> Path:
    _run([uv, "venv", "--quiet", *(["--seed"] if seed_pip else []), "--python", sys.executable, str(where)])
    return where / "bin" / "python"


def _install_third_party(uv: str, python: Path, requires: list[str]) -> None:
    torch_local = [str(LOCAL_TORCH_WHEELS[-1])] if LOCAL_TORCH_WHEELS else []
    if torch_local and any(_requirement_name(r) == "torch" for r in requires):
        requires = [r for r in requires if _requirement_name(r) != "torch"] + torch_local
    if requires:
        _run([uv, "pip", "install", "--quiet", "--python", str(python), *requires])


def _installed_ds(python: Path, ours: set[str]) -> set[str]:
    names = "import importlib.metadata as m; print(' '.join(d.metadata['Name'] for d in m.distributions()))"
    listing = _run([str(python), "-c", names])
    return {_normal(line) for line in listing.split()} & ours


def check_wheel(uv: str, out: Path, wheel: Path, ours: set[str], tmp: Path) -> None:
    name, version, _ = wheel_metadata(wheel)
    expected, third_party = closure(name, out, ours)
    python = _venv(uv, tmp / name)
    _install_third_party(uv, python, third_party)
    _run(
        [
            uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(python),
            "--no-index",
            "--find-links",
            str(out),
            f"{name}=={version}",
        ]
    )
    _run([str(python), "-c", f"import {_import_name(name)}"], cwd=tmp)  # not the clone: no stray imports
    installed = _installed_ds(python, ours)
    if installed != expected:
        raise CheckFailed(f"{name}: installed ds packages {sorted(installed)}, expected {sorted(expected)}")


def check_sparse_readme_line(uv: str, tmp: Path) -> None:
    python = _venv(uv, tmp / "readme-sparse", seed_pip=True)
    _install_third_party(uv, python, ["torch"])  # the CPU wheel first, so pip never pulls a CUDA torch
    _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *SPARSE_README_LINE])
    print("  " + _run([str(python), "-c", SPARSE_SMOKE], cwd=tmp).strip(), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="the folder for wheels and sdists")
    parser.add_argument("--uv", default=shutil.which("uv") or "uv", help="the uv executable")
    parser.add_argument("--only", nargs="*", help="check only these packages' wheels (all are built)")
    parser.add_argument("--skip-build", action="store_true", help="check the wheels already in --out")
    args = parser.parse_args(argv)
    names = sorted(p.name for p in PACKAGES.iterdir() if (p / "pyproject.toml").exists())
    try:
        if not args.skip_build:
            build(args.uv, args.out, names)
        wheels = sorted(args.out.glob("*.whl"))
        ours = {_normal(wheel_metadata(w)[0]) for w in wheels}
        missing = {_normal(n) for n in names} - ours
        if missing:
            raise CheckFailed(f"no wheel in {args.out} for {sorted(missing)}")
        with tempfile.TemporaryDirectory(prefix="ds-build-check-") as tmp:
            for wheel in wheels:
                name = wheel_metadata(wheel)[0]
                if args.only and name not in args.only:
                    continue
                start = time.monotonic()
                check_wheel(args.uv, args.out, wheel, ours, Path(tmp))
                print(
                    f"check: {name} installs alone from {args.out.name}/ and imports "
                    f"({time.monotonic() - start:.0f} s)",
                    flush=True,
                )
            if not args.only or "ds-sparse-attn" in args.only:
                start = time.monotonic()
                check_sparse_readme_line(args.uv, Path(tmp))
                print(f"check: ds-sparse-attn's README line from a clone ({time.monotonic() - start:.0f} s)")
    except CheckFailed as exc:
        print(f"build_packages: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
