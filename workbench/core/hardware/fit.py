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
    (steps and factor per kind, see ``_TERMS``). Where noise pulls that latency below zero
    (few sizes, all near the latency), the two ends decide as in an alpha-beta model: the
    largest sizes bound the bandwidth, and the smallest sizes' time beyond what that bandwidth
    explains is the latency (zero when the bandwidth explains it all).
    """
    rows, t = [], []
    for s in samples:
        steps, factor = _TERMS[s.kind](s.n)
        rows.append((steps, factor * s.nbytes))
        t.append(s.seconds)
    a, t = np.array(rows, float), np.array(t, float)
    w = 1.0 / t  # relative error: small and large sizes weigh alike
    (lat, inv_bw), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    if lat < 0 or not inv_bw > 0:
        lat, inv_bw = _ends(a, t, np.array([s.nbytes for s in samples], float))
    return float(1.0 / inv_bw), float(lat)


def _ends(a: np.ndarray, t: np.ndarray, nbytes: np.ndarray) -> tuple[float, float]:
    """(latency, seconds per byte) from the smallest and the largest sizes alone."""
    big, small = nbytes == nbytes.max(), nbytes == nbytes.min()
    inv_bw = float(np.median(t[big] / a[big, 1]))  # latency included: an upper bound
    if big.all():
        return 0.0, inv_bw
    lat = float(np.median(np.maximum(t[small] - a[small, 1] * inv_bw, 0.0) / a[small, 0]))
    left = t[big] - lat * a[big, 0]
    if (left > 0).all():
        inv_bw = float(np.median(left / a[big, 1]))
    return lat, inv_bw
