"""Collective cost formulas: alpha-beta ring times per collective kind, and `collective_time`,
which prices one collective over mesh axes on a `Hardware`'s levels.

Bytes are per device (the convention of ``core/layout/collectives.py``); n devices in the
group; bw, lat of the level's link:

- all-gather (bytes: the gathered output), reduce-scatter (the input):
  (n-1)/n * bytes/bw + (n-1) * lat; all-reduce twice that.
- all-to-all of the local array: (n-1)/n * bytes/bw + (n-1) * lat on a switch;
  floor(n^2/4)/n * bytes/bw + (n-1) * lat around a bidirectional torus ring.
- collective-permute: bytes/bw + lat.

A group spanning several levels is priced hierarchically (fastest level first, each on
the bytes left after the faster ones); ``hierarchical=False`` prices one flat ring at the
slowest bandwidth and largest latency. Sources and the reasoning: README.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from workbench.core.errors import InputError, given
from workbench.core.hardware.levels import KINDS, HardwareError, Link
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.redistribute import wire_bytes

if TYPE_CHECKING:
    from workbench.core.hardware.spec import Hardware


def ring_all_reduce_steps(n: int, nbytes: float = 1.0) -> list[dict]:
    """The 2(n-1) steps of a ring all-reduce of ``nbytes`` per device over ``n`` devices, the
    array cut into n chunks: in step k of the reduce-scatter half device i sends its running
    sum of chunk (i - k) mod n to device i+1 (after it, device i holds chunk (i + 1) mod n
    summed); in the all-gather half the summed chunks travel on round the ring. One dict per
    step: ``phase``, ``step`` (1-based within the phase), ``sends`` (``(source, target,
    chunk)``, one per device) and ``bytes`` (what each device sends in the step)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise InputError(
            f"n={given(n)} devices cannot form a ring; give an int of 2 or more, e.g. 4."
        )
    ok = isinstance(nbytes, int | float) and not isinstance(nbytes, bool)
    if not ok or not math.isfinite(nbytes) or nbytes <= 0:
        raise InputError(f"nbytes={given(nbytes)}: give the positive bytes per device.")
    per_step = wire_bytes("all-reduce", nbytes, n) / (2 * (n - 1))
    steps = []
    for phase, shift in (("reduce-scatter", 0), ("all-gather", 1)):
        for k in range(n - 1):
            sends = [(i, (i + 1) % n, (i + shift - k) % n) for i in range(n)]
            steps.append({"phase": phase, "step": k + 1, "sends": sends, "bytes": per_step})
    return steps


def all_gather_time(out_bytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-gather of ``out_bytes`` (the gathered output) over ``n`` devices."""
    return 0.0 if n <= 1 else (n - 1) / n * out_bytes / bandwidth + (n - 1) * latency


def reduce_scatter_time(in_bytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring reduce-scatter of ``in_bytes`` (the input, before scattering)."""
    return 0.0 if n <= 1 else (n - 1) / n * in_bytes / bandwidth + (n - 1) * latency


def all_reduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce (reduce-scatter then all-gather) of ``nbytes``."""
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency


def all_to_all_time(
    nbytes: float, n: int, bandwidth: float, latency: float, topology: str = "switch"
) -> float:
    """All-to-all of a local array of ``nbytes``: direct sends on a switch, forwarded
    around a bidirectional ring on a torus (see the module docstring)."""
    if n <= 1:
        return 0.0
    factor = (n - 1) / n if topology == "switch" else (n * n // 4) / n
    return factor * nbytes / bandwidth + (n - 1) * latency


def permute_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """Collective-permute: every device sends ``nbytes`` to one peer."""
    return nbytes / bandwidth + latency


def _for_kind(link: Link, kind: str) -> Link:
    if not link.kinds:
        return link
    bandwidth, latency = link.figures_for(kind)
    return Link(link.name, bandwidth, latency, link.topology)


def collective_time(
    kind: str,
    nbytes: float,
    axes: Iterable[str],
    mesh: Mesh,
    hardware: Hardware,
    *,
    hierarchical: bool = True,
) -> float:
    """Seconds one collective takes on ``hardware``, over mesh ``axes`` (see module doc)."""
    if kind not in KINDS:
        raise HardwareError(f"unknown collective kind {kind!r}; use one of {KINDS}.")
    axes = tuple(axes)
    if not axes or nbytes <= 0:
        return 0.0
    if len(set(axes)) != len(axes):
        raise HardwareError(f"a collective runs over each mesh axis once; got axes {axes}.")
    # each level's figures for this kind of collective (its own, unless measured per kind)
    levels = [(_for_kind(x, kind), n) for x, n in hardware.spread(mesh, axes)]
    if not levels:  # every axis of size 1
        return 0.0
    if kind == "collective-permute":
        slowest = min((x for x, _ in levels), key=lambda x: x.bandwidth)
        return permute_time(nbytes, slowest.bandwidth, max(x.latency for x, _ in levels))
    if not hierarchical and len(levels) > 1:
        flat = Link(
            "flat",
            min(x.bandwidth for x, _ in levels),
            max(x.latency for x, _ in levels),
            "torus" if any(x.topology == "torus" for x, _ in levels) else "switch",
        )
        levels = [(flat, math.prod(n for _, n in levels))]
    total, done = 0.0, 1  # `done`: product of the sizes of the faster levels
    for x, n in sorted(levels, key=lambda lv: -lv[0].bandwidth):
        if kind == "all-to-all":
            total += all_to_all_time(nbytes, n, x.bandwidth, x.latency, x.topology)
            continue
        stage = {
            "all-gather": all_gather_time,
            "reduce-scatter": reduce_scatter_time,
            "all-reduce": all_reduce_time,
        }[kind]
        total += stage(nbytes / done, n, x.bandwidth, x.latency)
        done *= n
    return total
