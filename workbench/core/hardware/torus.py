"""Torus levels that know their dimensions (TPU ICI): which of them a collective's group
covers, and the bandwidth that gives it.

On a torus level with ``dims`` the factors the placement gives the mesh's axes there lie
in mesh order, the last axis on the fastest dimension, as devices number in a group
(``placement.py``). A group's extent on each dimension is the product of its axes'
overlaps with it. HTSYM (https://jax-ml.github.io/scaling-book/sharding/): a collective
over several torus axes "increases the available bandwidth by a factor of n_axes"; a
dimension the group covers whole runs a ring over its wraparound link when the slice's
size there is a multiple of ``wraps_at`` (https://jax-ml.github.io/scaling-book/tpus/:
"Any multiple of a full cube (e.g. 4x4x4 or 4x4x8) will have wraparounds"); a line
without one, or part of a dimension, "typically doubles the time". So the group's
bandwidth is the link's times the sum over the dimensions it covers of 1 (a wrapped ring)
or 1/2 (a line).
"""

from __future__ import annotations

import dataclasses
import math

from workbench.core.errors import given
from workbench.core.hardware.levels import HardwareError, Link, positive_int


def extents(dims: tuple[int, ...], factors: list[int], chosen: list[bool]) -> list[int] | None:
    """Per dimension, how many devices of it the chosen axes' group spans; ``factors``:
    each axis's factor on the level, in mesh order. None where an axis's range of
    positions does not split along the dimensions' boundaries."""
    out = [1] * len(dims)
    stride = 1
    for f, mine in zip(reversed(factors), reversed(chosen)):
        lo, hi = stride, stride * f  # the axis's positions: multiples lo .. hi (exclusive)
        start = 1
        for j, d in enumerate(dims):
            a, b = max(lo, start), min(hi, start * d)  # overlap of [lo, hi) and the dimension
            if a < b:
                if b % a:
                    return None
                if mine:
                    out[j] *= b // a
            start *= d
        stride = hi
    return out


def torus_link(link: Link, factors: list[int], chosen: list[bool]) -> Link:
    """``link`` with the bandwidth a group of the chosen axes gets on it (module doc); the
    link as it is where it knows no dims or the axes do not lie along them."""
    if not link.dims or math.prod(factors) != math.prod(link.dims):
        return link
    spans = extents(link.dims, factors, chosen)
    if spans is None:
        return link
    scale = 0.0
    for d, e in zip(link.dims, spans):
        if e > 1:
            wraps = e == d and link.wraps_at is not None and d % link.wraps_at == 0
            scale += 1.0 if wraps else 0.5
    if scale == 0.0:
        return link
    kinds = tuple((k, bw * scale, lat) for k, bw, lat in link.kinds)
    return dataclasses.replace(link, bandwidth=link.bandwidth * scale, kinds=kinds)


def with_torus(hardware, dims, level: str | None):
    """``hardware`` with its torus ``level`` (default: the first) a slice of ``dims``
    (``Hardware.with_torus``)."""
    tori = [x.name for x in hardware.links if x.topology == "torus"]
    if level is None and not tori:
        raise HardwareError(
            f"{hardware.name!r} has no torus level to give dims; its levels are "
            f"{[x.name for x in hardware.links]}."
        )
    dims = tuple(dims) if isinstance(dims, list | tuple) else dims
    if not (isinstance(dims, tuple) and dims and all(positive_int(d) for d in dims)):
        raise HardwareError(
            f"with_torus({given(dims)}): give the slice's dimensions, fastest first, e.g. (4, 4, 8)."
        )
    x = hardware._link_named(tori[0] if level is None else level)
    new = dataclasses.replace(x, dims=dims, group_size=math.prod(dims))  # checks the topology
    links = tuple(new if y is x else y for y in hardware.links)
    return dataclasses.replace(hardware, links=links, devices_per_node=links[0].group_size)
