"""Plot the timeline of one optimizer step with NVMe offload: updates (compute) and disk reads and writes.

Reads the JSON that ``tools/bench/bench_largest_fit.py --trace FILE`` (the whole training step: forward+backward, then the optimizer
step) writes for rank 0's last step: the intervals, each sub-group's update, each I/O request as the worker
thread ran it; draws one row per kind, with the bytes moved per second and the share of the time the disk
was busy, for the optimizer step and (when recorded) the whole training step; prints those and, for the
optimizer step, each direction's bytes over its time in flight, the update's compute and the part of it
under I/O, and the time with no I/O in flight.

    python tools/bench/plot_nvme_timeline.py FILE timeline.png
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def busy(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of the intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    events = json.load(open(args.trace))
    (step,) = [(a, b) for k, a, b, _ in events if k == "step"]
    fwd_bwd = [(a, b) for k, a, b, _ in events if k == "fwd_bwd"]
    rows = {"update": [], "read": [], "write": []}
    for k, a, b, n in events:
        if k in rows:
            rows[k].append((a, b, n))
    kinds = [("fwd_bwd", "forward+backward", "tab:purple")] if fwd_bwd else []
    kinds += [("update", "optimizer update", "tab:blue"), ("read", "disk read", "tab:green"),
              ("write", "disk write", "tab:red")]  # fmt: skip
    if fwd_bwd:
        rows["fwd_bwd"] = [(a, b, 0) for a, b in fwd_bwd]
    begin = fwd_bwd[0][0] if fwd_bwd else step[0]
    fig, ax = plt.subplots(figsize=(11, 3.0 if fwd_bwd else 2.6))
    for y, (kind, _, color) in enumerate(kinds):
        ax.broken_barh([(a, b - a) for a, b, _ in rows[kind]], (y - 0.4, 0.8), color=color)
    ax.set_yticks(range(len(kinds)), [label for _, label, _ in kinds])
    ax.set_xlabel(
        "seconds from the start of the optimizer step" + (" (forward+backward before 0)" if fwd_bwd else "")
    )
    ax.set_xlim(begin, step[1])
    lines = [summary("optimizer step", step, rows)]
    if fwd_bwd:
        lines.insert(0, summary("whole step", (begin, step[1]), rows))
    ax.set_title((args.title + "\n" if args.title else "") + "\n".join(lines), fontsize=9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print("\n".join([*lines, detail(step, rows)]))


def summary(what: str, window: tuple[float, float], rows: dict) -> str:
    """Bytes moved in ``window`` per second, the share of it the disk was busy, I/O under compute."""
    a0, b0 = window
    span = b0 - a0

    def inside(kind: str) -> list[tuple[float, float, int]]:
        return [(max(a, a0), min(b, b0), n) for a, b, n in rows.get(kind, []) if b > a0 and a < b0]

    io = inside("read") + inside("write")
    compute = inside("update") + inside("fwd_bwd")
    moved = sum(n for _, _, n in io)
    io_busy = busy([(a, b) for a, b, _ in io])
    both = busy([(a, b) for a, b, _ in compute]) + io_busy - busy([(a, b) for a, b, _ in compute + io])
    return (f"{what} {span:.2f} s, {moved / 1e9:.2f} GB moved = {moved / span / 1e9:.2f} GB/s; disk busy "
            f"{io_busy / span:.0%} of it, {both:.2f} s of I/O under compute")  # fmt: skip


def detail(window: tuple[float, float], rows: dict) -> str:
    """The optimizer step's reads and writes each over the time they were in flight, the update's compute
    and how much of it ran under I/O, and the time with no I/O in flight."""
    a0, b0 = window
    parts = {k: [(max(a, a0), min(b, b0), n) for a, b, n in rows[k] if b > a0 and a < b0] for k in rows}
    spans = {k: [(a, b) for a, b, _ in v] for k, v in parts.items()}
    io = spans["read"] + spans["write"]
    out = []
    for kind in ("read", "write"):
        t, n = busy(spans[kind]), sum(x for _, _, x in parts[kind])
        out.append(f"{kind} {n / 1e9:.2f} GB in {t:.2f} s in flight ({n / 1e9 / t if t else 0:.2f} GB/s)")
    compute = busy(spans["update"])
    under = compute + busy(io) - busy(spans["update"] + io)
    out.append(f"update compute {compute:.2f} s, {under:.2f} s of it under I/O")
    out.append(f"no I/O in flight {b0 - a0 - busy(io):.2f} s")
    return "optimizer step: " + "; ".join(out)


if __name__ == "__main__":
    main()
