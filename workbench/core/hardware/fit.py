"""Fitting timings to the formulas of ``collectives.py``: a `Sample` is one timed collective,
`fit_link` the (bandwidth, latency) that best explain a set of them, and `fit_slope` the
per-byte cost of a set of timed sizes with the fixed cost as intercept."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed collective: its kind, group size, bytes (per device, as in `hardware`), seconds."""

    kind: str  # one of hardware.KINDS
    n: int
    nbytes: float
    seconds: float


def fit_slope(sizes: Sequence[float], seconds: Sequence[float]) -> float:
    """Seconds per unit of ``sizes`` (least squares, with an intercept for fixed costs).

    Falls back to the largest sample's seconds / size where noise makes the slope
    non-positive.
    """
    x, t = np.asarray(sizes, float), np.asarray(seconds, float)
    if len(x) >= 2 and np.ptp(x) > 0:
        slope = float(np.polyfit(x, t, 1)[0])
        if slope > 0:
            return slope
    big = int(np.argmax(x))
    return float(t[big] / x[big])


#: Per kind: (latency steps, bandwidth factor on bytes) for a group of n, the formulas of
#: `hardware` on a switch (the topology calibrate measures).
_TERMS = {
    "all-reduce": lambda n: (2 * (n - 1), 2 * (n - 1) / n),
    "all-gather": lambda n: (n - 1, (n - 1) / n),
    "reduce-scatter": lambda n: (n - 1, (n - 1) / n),
    "all-to-all": lambda n: (n - 1, (n - 1) / n),
    "collective-permute": lambda n: (1, 1.0),
}


def fit_link(samples: Sequence[Sample]) -> tuple[float, float]:
    """(bandwidth, latency) that best explain the samples by the formulas of `hardware`.

    Least squares on relative error of ``t = latency * steps + bytes * factor / bandwidth``
    (steps and factor per kind, see ``_TERMS``); a negative latency is refitted as zero, a
    non-positive slope falls back to the largest sample's bytes / time.
    """
    rows, t = [], []
    for s in samples:
        steps, factor = _TERMS[s.kind](s.n)
        rows.append((steps, factor * s.nbytes))
        t.append(s.seconds)
    a, t = np.array(rows, float), np.array(t, float)
    w = 1.0 / t  # relative error: small and large sizes weigh alike
    (lat, inv_bw), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    if lat < 0:
        col = a[:, 1] * w
        lat, inv_bw = 0.0, float(col @ (t * w) / (col @ col))
    if not inv_bw > 0:
        big = max(range(len(t)), key=lambda i: a[i, 1])
        lat, inv_bw = 0.0, t[big] / a[big, 1]
    return float(1.0 / inv_bw), float(max(lat, 0.0))
