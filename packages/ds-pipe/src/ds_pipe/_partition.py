"""How layers are split into stages: DeepSpeed's boundaries ("uniform", and balanced by weight).

``parts`` is a list of ``num_parts + 1`` layer indices; stage ``s`` holds layers ``parts[s]:parts[s+1]``.
"""

from __future__ import annotations

import math

__all__ = ["partition_balanced", "partition_uniform"]


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Equal shares, the first ``num_items % num_parts`` parts one longer; with fewer items than parts, one
    item each and then empty parts."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, extra = divmod(num_items, num_parts)
    return [p * chunk + min(p, extra) for p in range(num_parts + 1)]


def partition_balanced(weights: list[float], num_parts: int) -> list[int]:
    """Contiguous parts whose weight sums are as even as possible: the split minimising the spread between
    the heaviest and the lightest part (linear partition by dynamic programming). Among equal spreads the
    last split point found wins, which is the split DeepSpeed 0.19.8 picks (its recorded boundaries are the
    test's fixture)."""
    n = len(weights)
    if n <= num_parts:
        return partition_uniform(n, num_parts)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = math.inf
    # best[i][j]: (cost, heaviest, lightest) of the first i items in j parts; cut[i][j]: where part j starts
    cost = [[inf] * (num_parts + 1) for _ in range(n + 1)]
    heavy = [[inf] * (num_parts + 1) for _ in range(n + 1)]
    light = [[inf] * (num_parts + 1) for _ in range(n + 1)]
    cut = [[0] * (num_parts + 1) for _ in range(n + 1)]
    cost[0][0] = heavy[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, num_parts) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                hi = max(heavy[k][j - 1], part)
                lo = min(light[k][j - 1], part)
                c = hi - lo
                if cost[i][j] >= c:  # ">=": a later cut with an equal spread replaces an earlier one
                    cost[i][j], heavy[i][j], light[i][j], cut[i][j] = c, hi, lo, k
    parts = [n]
    for j in range(num_parts, 0, -1):
        parts.append(cut[parts[-1]][j])
    return parts[::-1]
