"""Plot the timeline of one optimizer step with NVMe offload: updates (compute) and disk reads and writes.

Reads the JSON that ``tools/bench/bench_stage3_fit.py --trace FILE`` writes (rank 0's last step: the step's
interval, each sub-group's update, each I/O request as the worker thread ran it) and draws one row per
kind, with the bytes moved per second of the step and the share of the step the disk was busy.

    python tools/bench/plot_nvme_timeline.py FILE docs/benchmarks/nvme-step-timeline.png
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
    rows = {"update": [], "read": [], "write": []}
    moved = 0
    for k, a, b, n in events:
        if k in rows:
            rows[k].append((a, b))
            moved += n if k != "update" else 0
    span = step[1] - step[0]
    io_busy = busy(rows["read"] + rows["write"])
    overlap = busy(rows["update"]) + io_busy - busy(rows["update"] + rows["read"] + rows["write"])
    fig, ax = plt.subplots(figsize=(10, 2.6))
    for y, (kind, color) in enumerate((("update", "tab:blue"), ("read", "tab:green"), ("write", "tab:red"))):
        ax.broken_barh([(a, b - a) for a, b in rows[kind]], (y - 0.4, 0.8), color=color)
    ax.set_yticks(range(3), ["update (compute)", "disk read", "disk write"])
    ax.set_xlabel("seconds from the start of the optimizer step")
    ax.set_xlim(step[0], step[1])
    ax.set_title(
        (args.title + "\n" if args.title else "")
        + f"step {span:.2f} s, {moved / 1e9:.2f} GB moved = {moved / span / 1e9:.2f} GB/s; disk busy "
        f"{io_busy / span:.0%} of the step, {overlap:.2f} s of I/O under compute",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"step {span:.3f} s, moved {moved} B ({moved / span / 1e9:.3f} GB/s), disk busy {io_busy / span:.1%}, "
          f"I/O overlapping compute {overlap:.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
