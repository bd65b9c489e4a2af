"""Collective cost formulas: alpha-beta ring times per collective kind, and `collective_time`,
which prices one collective over mesh axes on a `Hardware`'s levels.

Bytes are per device (the convention of ``core/layout/collectives.py``); n devices in the
group; bw, lat of the level's link:

- all-gather (bytes: the gathered output), reduce-scatter (the input):
  (n-1)/n * bytes/bw + (n-1) * lat; all-reduce twice that.
- all-to-all of the local array: (n-1)/n * bytes/bw + (n-1) * lat on a switch;
  floor(n^2/4)/n * bytes/bw + (n-1) * lat around a bidirectional torus ring.
- collective-permute: bytes/bw + lat.

A group spanning several levels: an all-reduce, reduce-scatter or all-gather runs as the
cheapest program of per-level steps (``synthesis.py``; the hierarchical algorithm or
better, its blocks permuted where its order is not the result's); an all-to-all one full
stage per level. ``hierarchical=False`` prices one flat ring at the slowest
bandwidth and largest latency (the synthesis's default). The formulas are in
``formulas.py``; sources and the reasoning: README.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from workbench.core.errors import InputError, given
from workbench.core.hardware.formulas import (
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    permute_time,
    reduce_scatter_time,
)
from workbench.core.hardware.levels import KINDS, HardwareError, Link
from workbench.core.hardware.synthesis import SYNTHESISED, Synthesis, best
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


def _for_kind(link: Link, kind: str) -> Link:
    if not link.kinds and not link.efficiency:
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
    return priced(kind, nbytes, axes, mesh, hardware, hierarchical=hierarchical)[0]


def priced(
    kind: str,
    nbytes: float,
    axes: Iterable[str],
    mesh: Mesh,
    hardware: Hardware,
    *,
    hierarchical: bool = True,
) -> tuple[float, Synthesis | None]:
    """``collective_time``'s seconds, and the synthesised program they are the time of
    (None where the group is on one level, or the kind is not synthesised)."""
    if kind not in KINDS:
        raise HardwareError(f"unknown collective kind {kind!r}; use one of {KINDS}.")
    axes = tuple(axes)
    if not axes or nbytes <= 0:
        return 0.0, None
    if len(set(axes)) != len(axes):
        raise HardwareError(f"a collective runs over each mesh axis once; got axes {axes}.")
    spread = hardware.spread(mesh, axes)
    # each level's figures for this kind of collective (its own, unless measured per kind)
    levels = [(_for_kind(x, kind), n) for x, n in spread]
    if not levels:  # every axis of size 1
        return 0.0, None
    if kind == "collective-permute":
        slowest = min((x for x, _ in levels), key=lambda x: x.bandwidth)
        return permute_time(nbytes, slowest.bandwidth, max(x.latency for x, _ in levels)), None
    if not hierarchical and len(levels) > 1:
        flat = Link(
            "flat",
            min(x.bandwidth for x, _ in levels),
            max(x.latency for x, _ in levels),
            "torus" if any(x.topology == "torus" for x, _ in levels) else "switch",
        )
        levels = [(flat, math.prod(n for _, n in levels))]
    if kind in SYNTHESISED and len(levels) > 1:
        chosen = _synthesised(kind, nbytes, axes, mesh, hardware, spread)
        return chosen.seconds, chosen
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
    return total, None


def synthesised(kind: str, nbytes: float, axes, mesh: Mesh, hardware: Hardware):
    """The cheapest program of per-level steps for a ``kind`` collective (all-reduce,
    reduce-scatter or all-gather) of ``nbytes`` per device over mesh ``axes``
    (``synthesis.best``): which levels each step runs on, its time and the default's (one
    ring over the group)."""
    if kind not in SYNTHESISED:
        raise HardwareError(f"synthesised({kind!r}): only {SYNTHESISED} are synthesised.")
    return _synthesised(kind, nbytes, axes, mesh, hardware, hardware.spread(mesh, tuple(axes)))


def _synthesised(kind: str, nbytes: float, axes, mesh: Mesh, hardware: Hardware, spread):
    """`synthesised` over the group's ``spread`` (``Hardware.spread``), known already."""
    index = {link.name: i for i, (link, _) in enumerate(spread)}
    order = []  # per axis: the group's levels it lies on, outermost first
    for axis in axes:
        mine = [index[link.name] for link, _ in hardware.spread(mesh, (axis,))]
        order.append(tuple(sorted(mine, reverse=True)))
    copy = 2 * nbytes / hardware.copy_bandwidth(nbytes) + hardware.op_overhead
    return best(kind, float(nbytes), tuple(spread), copy, tuple(order))
