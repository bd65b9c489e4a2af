"""One level of a hardware topology: the link a group of devices (or of lower-level groups)
shares, with its alpha-beta figures, its shape and where each figure comes from.

A `Hardware` lists its levels innermost first (see ``spec.py``); ``README.md`` says what a
level's figures mean and where a new one goes.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field

from workbench.core.errors import InputError

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
TOPOLOGIES = ("switch", "torus")


class HardwareError(InputError):
    """A hardware spec was described wrongly, or asked for something it does not have
    (an `InputError`, so also a ``ValueError``)."""


@dataclass(frozen=True, slots=True)
class Link:
    """One interconnect level: per-device egress bandwidth (bytes/s, one direction),
    latency per collective step (s), and topology ("switch": any device reaches any
    other in one hop; "torus": neighbours only, as TPU ICI). ``kinds`` optionally holds
    measured ``(kind, bandwidth, latency)`` triples that replace the two figures for one
    collective kind (see `figures_for`). ``group_size``: how many devices (first level) or
    groups of the level below one group of this level joins; None leaves the outermost
    level open (it joins everything), and the first level's may come from
    ``Hardware.devices_per_node``. ``sources``: figure (a key of `figures`) -> where it
    comes from; not part of equality or the repr. ``efficiency``: per kind, the share of
    ``bandwidth`` it reaches (measured), so a link priced slower prices its kinds slower
    too. A torus level may know its ``dims`` (one group's torus, fastest dimension first;
    their product is ``group_size``) and ``wraps_at`` (a dimension has its wraparound link
    when its size is a multiple of this); see ``torus.py``."""

    name: str
    bandwidth: float
    latency: float
    topology: str = "switch"
    kinds: tuple[tuple[str, float, float], ...] = ()
    group_size: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    dims: tuple[int, ...] = ()
    wraps_at: int | None = None
    #: ``(kind, share)`` pairs: the share of ``bandwidth`` a collective kind reaches, measured
    #: (NCCL's bus bandwidth; above 1 where a switch reduces in the network); scales with it
    efficiency: tuple[tuple[str, float], ...] = ()

    def figures_for(self, kind: str) -> tuple[float, float]:
        """``(bandwidth, latency)`` collectives of ``kind`` get on this link."""
        for k, bandwidth, latency in self.kinds:
            if k == kind:
                return bandwidth, latency
        share = next((x for k, x in self.efficiency if k == kind), 1.0)
        return self.bandwidth * share, self.latency

    def figures(self) -> dict[str, float]:
        """This level's numbers under the keys its ``sources`` are filed under."""
        out = {"bandwidth": self.bandwidth, "latency": self.latency}
        for kind, bandwidth, latency in self.kinds:
            out[f"{kind}.bandwidth"] = bandwidth
            out[f"{kind}.latency"] = latency
        for kind, share in self.efficiency:
            out[f"{kind}.efficiency"] = share
        if self.group_size is not None:
            out["group_size"] = self.group_size
        if self.wraps_at is not None:
            out["wraps_at"] = self.wraps_at
        return out

    def __post_init__(self):
        object.__setattr__(self, "kinds", tuple(tuple(k) for k in self.kinds))
        object.__setattr__(self, "sources", dict(self.sources))
        for entry in self.kinds:
            ok = (
                len(entry) == 3
                and entry[0] in KINDS
                and positive(entry[1])
                and finite_nonneg(entry[2])
            )
            if not ok:
                raise HardwareError(
                    f"link {self.name!r} has per-kind figures {entry!r}; give "
                    f"(kind, bandwidth bytes/s > 0, latency s >= 0) with kind one of {KINDS}."
                )
        object.__setattr__(self, "efficiency", tuple(tuple(e) for e in self.efficiency))
        for entry in self.efficiency:
            if not (len(entry) == 2 and entry[0] in KINDS and positive(entry[1]) and entry[1] <= 2):
                raise HardwareError(
                    f"link {self.name!r} has efficiency {entry!r}; give (kind, share of its "
                    f"bandwidth in (0, 2]) with kind one of {KINDS}."
                )
        if len({k for k, _ in self.efficiency}) != len(self.efficiency):
            raise HardwareError(f"link {self.name!r} lists a kind's efficiency twice.")
        if len({k for k, _, _ in self.kinds}) != len(self.kinds):
            raise HardwareError(f"link {self.name!r} lists a collective kind twice: {self.kinds}.")
        if not (self.name and isinstance(self.name, str)):
            raise HardwareError(f"a link needs a name, e.g. 'nvlink'; got {self.name!r}.")
        if not (positive(self.bandwidth) and finite_nonneg(self.latency)):
            raise HardwareError(
                f"link {self.name!r} has bandwidth {self.bandwidth!r} and latency "
                f"{self.latency!r}; bandwidth must be a positive number of bytes/s and "
                "latency a non-negative number of seconds."
            )
        if self.topology not in TOPOLOGIES:
            raise HardwareError(
                f"link {self.name!r} has topology {self.topology!r}; use one of {TOPOLOGIES}."
            )
        object.__setattr__(self, "dims", tuple(self.dims))
        if self.dims or self.wraps_at is not None:
            _check_torus(self)
        if self.group_size is not None and not positive_int(self.group_size):
            raise HardwareError(
                f"link {self.name!r} has group_size={self.group_size!r}; give how many devices "
                "(or groups of the level below) one group joins, a positive integer, or None "
                "for an outermost level that joins everything."
            )


def _check_torus(link: Link) -> None:
    dims_ok = all(positive_int(d) for d in link.dims)
    wrap_ok = link.wraps_at is None or positive_int(link.wraps_at)
    if link.topology != "torus" or not dims_ok or not wrap_ok:
        raise HardwareError(
            f"link {link.name!r} has dims={link.dims!r}, wraps_at={link.wraps_at!r} on a "
            f"{link.topology!r}; a torus level takes dims, positive ints fastest first (e.g. "
            "(4, 4, 8)), and wraps_at, the multiple of a dimension's size that has a "
            "wraparound link (e.g. 4)."
        )
    if link.dims and link.group_size is not None and math.prod(link.dims) != link.group_size:
        raise HardwareError(
            f"link {link.name!r} has dims {link.dims} ({math.prod(link.dims)} devices) but "
            f"group_size={link.group_size}; give dims whose product is the group's size "
            "(Hardware.with_torus sets both)."
        )


def finite_nonneg(x) -> bool:
    """A real number (not a bool), finite and at least 0."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def positive(x) -> bool:
    """A real number (not a bool), finite and above 0."""
    return finite_nonneg(x) and x > 0


def positive_int(x) -> bool:
    """An int (not a bool) of at least 1."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1
