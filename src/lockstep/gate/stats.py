"""The statistics the gates rest on: a rank test and a bootstrap interval, in numpy only.
Why these: docs/design/gates.md."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np


def mann_whitney_greater(x, y) -> float:
    """One-sided p-value of H1 "x tends to be larger than y" (Mann-Whitney U).

    Exact (all splits enumerated) while that stays cheap, else the normal approximation with
    the tie correction.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        return 1.0
    pooled = np.concatenate([x, y])
    ranks = _ranks(pooled)
    u = ranks[:n].sum() - n * (n + 1) / 2
    if math.comb(n + m, n) <= 20_000:
        # P(U >= u) over every way to pick which pooled ranks belong to x.
        total = math.comb(n + m, n)
        offset = n * (n + 1) / 2
        hits = sum(
            1
            for idx in combinations(range(n + m), n)
            if ranks[list(idx)].sum() - offset >= u - 1e-9
        )
        return hits / total
    _, counts = np.unique(pooled, return_counts=True)
    tie = (counts**3 - counts).sum() / ((n + m) * (n + m - 1))
    sigma = math.sqrt(n * m / 12 * ((n + m + 1) - tie))
    if sigma == 0:
        return 1.0
    z = (u - n * m / 2 - 0.5) / sigma  # continuity correction
    return 0.5 * math.erfc(z / math.sqrt(2))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their mean rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    sorted_values = values[order]
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or sorted_values[i] != sorted_values[start]:
            if i - start > 1:
                ranks[order[start:i]] = (start + 1 + i) / 2
            start = i
    return ranks


def ratio_interval(
    head, base, confidence: float = 0.95, draws: int = 4000, seed: int = 0
) -> tuple[float, float, float]:
    """(ratio of medians head/base, low, high): a percentile bootstrap over each side."""
    head, base = np.asarray(head, float), np.asarray(base, float)
    ratio = float(np.median(head) / np.median(base))
    rng = np.random.default_rng(seed)
    h = rng.choice(head, size=(draws, len(head)), replace=True)
    b = rng.choice(base, size=(draws, len(base)), replace=True)
    ratios = np.median(h, axis=1) / np.median(b, axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return ratio, float(low), float(high)
