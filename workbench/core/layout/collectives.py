"""The collective plan's value type: one collective the partitioned program performs.

The explicit lowering performs exactly these; the simulator prices them; the UI lists
them with their why. Byte counts are per device, by one convention (the one "How to
Scale Your Model" uses for its cost formulas):

- all-gather: the bytes of the gathered (output) array;
- reduce-scatter: the bytes of the input array, before scattering;
- all-reduce, all-to-all, collective-permute: the bytes of the array.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.layout.sharding import Sharding

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective: what it moves, over which mesh axes, and why it is there."""

    kind: str  # one of KINDS
    value: int  # the value it moves
    axes: tuple[str, ...]  # mesh axes it runs over, major to minor
    bytes: int  # per device, see the module docstring
    op: int | None  # the op that needs it; None when a program output needs it
    tactic: int | None  # the tactic that decided what made it necessary
    src: Sharding  # the value's layout before
    dst: Sharding  # and after
    dim: int | None = None  # the dimension gathered, scattered or split (all-to-all: the split one)
    dim_from: int | None = None  # all-to-all: the dimension concatenated
    reduction: str | None = None  # all-reduce / reduce-scatter: "sum", "max" or "min"
    why: str = ""  # one sentence for people
    count: int = 1  # times it runs per step (inside a scan body: the scan's length)
    step: int | None = None  # its index among the value's redistribution steps
    #: the code it comes from, "path:line (function)": the user's line of the op that needs
    #: it (else of the op that made the value), and the library line beside it, or ""
    source: str = ""
    library: str = ""
