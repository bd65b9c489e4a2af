"""What a record holds: the value types of one primitive's facets (see README.md).

A ``Record`` is frozen: its rule (or an explicit ``Barrier``), its cost, its fusion classes
per backend, its lowering on local shards and its ``Traits``. The family modules build them
(``registry.register``); the rest of core reads them through ``registry``'s queries.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from workbench.core.ops.mapping import FactorMapping, TensorType, barrier_mapping


class Rule(Protocol):
    def __call__(
        self,
        params: Mapping[str, Any],
        operands: Sequence[TensorType],
        results: Sequence[TensorType],
    ) -> FactorMapping: ...


@dataclass(frozen=True, slots=True)
class Barrier:
    """A rule that blocks every factor, on purpose: ``reason`` says why (warned once)."""

    reason: str
    _warned: set = field(default_factory=set, compare=False, repr=False)

    def __call__(self, params, operands, results) -> FactorMapping:
        return barrier_mapping(operands, results)

    def warn(self, primitive: str) -> None:
        if primitive not in self._warned:
            self._warned.add(primitive)
            warnings.warn(
                f"workbench treats primitive {primitive!r} as a barrier: {self.reason}",
                stacklevel=3,
            )


@dataclass(frozen=True, slots=True)
class Fusion:
    """How one backend's compiler fuses a primitive (the simulator's fusion classes)."""

    loop: bool = False  # fuses into an elementwise loop kernel: its value may stay in registers
    fuses_inputs: bool = False  # reads a fused value without a buffer (loop ops and reductions)
    expensive: bool = False  # computed once, into a buffer, when several kernels read it
    copies_operands: bool = False  # reads operands in its own order, through transposed copies
    bitcast: bool = False  # compiles to no kernel (a rename, a row-major reshape)
    why: str = ""  # where the class comes from when not from today's tables (see README.md)


#: Its own kernel; fuses nothing.
KERNEL = Fusion()
#: Elementwise: fused into loop kernels, recomputed in each reader.
LOOP = Fusion(loop=True, fuses_inputs=True)
#: Elementwise but dear: fused, yet computed once when several kernels read it.
EXPENSIVE = Fusion(loop=True, fuses_inputs=True, expensive=True)
#: A reduction: its own kernel, fusing the elementwise chain it reads.
REDUCTION = Fusion(fuses_inputs=True)
#: No kernel at all (a bitcast).
BITCAST = Fusion(bitcast=True)
#: No kernel, and fused like an elementwise op (renames, identities, row-major reshapes).
RENAME = Fusion(loop=True, fuses_inputs=True, bitcast=True)
#: A matmul or convolution: operands held in another order are copied into its order.
COPYING = Fusion(copies_operands=True)
#: Data movement the simulator prices as its own kernel though XLA:CPU loop-fuses it.
MOVES = Fusion(
    why="a kernel: the simulator fuses elementwise chains only; XLA:CPU would loop-fuse this "
    "data movement, and the golden estimates pin the zoo's transposes, concatenates, gathers"
)


@dataclass(frozen=True, slots=True)
class Fusions:
    """A primitive's fusion classes per backend: ``cpu`` read from XLA:CPU's compiled HLO;
    ``gpu`` and ``tpu`` None until they are read from XLA's sources."""

    cpu: Fusion
    gpu: Fusion | None = None
    tpu: Fusion | None = None


BACKENDS = ("cpu", "gpu", "tpu")


@dataclass(frozen=True, slots=True)
class Call:
    """A call capture inlines: ``param`` holds its sub-jaxpr; ``scope``, where set, names a
    param whose value the callee's ops take as a scope (a jitted function's name)."""

    param: str
    scope: str | None = None


class Control:
    """A loop or a branch: how its regions stand for its operands and results.

    ``kind`` is ``"loop"`` or ``"branch"``. Subclasses (``control_flow``) give one
    primitive's layout of regions."""

    __slots__ = ()
    kind: str = ""

    def regions(self, params, operands) -> tuple[tuple[str, Any, tuple[str, ...], tuple], ...]:
        """Per region: (name, closed jaxpr, role of each input, the outer operands they stand for)."""
        raise NotImplementedError

    def region_operands(self, params, operands, n_regions: int) -> list[tuple]:
        """Per region, the outer operands its inputs stand for."""
        raise NotImplementedError

    def carried(self, params, operands, region_inputs: int) -> range:
        """Positions of a region's inputs carried from step to step (none for a branch)."""
        return range(0)

    def trips(self, params) -> int:
        """How many times a body runs, as priced (1 where unknown: a while loop)."""
        return 1

    def stacked(self, params, result: int) -> bool:
        """Whether result ``result`` is stacked step by step (a scan's per-step outputs)."""
        return False

    def jaxprs(self, params) -> tuple:
        """The regions' closed jaxprs, in region order."""
        raise NotImplementedError

    def run(self, params, args: list, n_in: int, n_res: int, body: Callable) -> list:
        """The op evaluated with JAX's control flow; ``body(k, values, out_start, in_start)``
        evaluates region ``k`` on ``values`` (its outputs are linked operands from
        ``out_start``, its inputs linked results from ``in_start``)."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Traits:
    """What the rest of core asks of a primitive instead of its name. False/None: not so."""

    transparent: bool = False  # a cast or relayout: a parameter read through it is still itself
    call: Call | None = None  # a call capture inlines
    tag: str | None = None  # the tag primitive (``wb.tag``): the param holding the tag's name
    random: bool = False  # draws on random keys (an input read only by such ops is a key)
    control: Control | None = None  # a loop or a branch, with regions
    contraction: bool = False  # a matmul (dot_general): projections, weight gradients
    convolution: bool = False  # conv_general_dilated
    lookup: bool = False  # looks rows up in a table (gather): embeddings
    accumulates: bool = False  # sums the contributions to one gradient (add_any)
    constraint: bool = False  # a user's sharding constraint: a layout, not a computation
    cast: bool = False  # converts its operand to another dtype (convert_element_type)
    bitwise: bool = False  # means its operands' bits: float64 binds it at the program's dtypes
    rounding: bool = False  # only rounds: the identity in float64
    broadcasts: bool = False  # fills its result from a scalar or a smaller array (broadcast, iota)
    permutes: bool = False  # permutes dimensions (transpose): a matmul may write in its order


NO_TRAITS = Traits()


@dataclass(frozen=True, slots=True)
class Record:
    """Everything the engine knows about one primitive.

    ``rule(params, operands, results) -> FactorMapping`` (a ``Barrier`` blocks everything);
    ``cost(params, operands, results) -> OpCost`` on local types; ``fusion`` per backend;
    ``local(op, args, ins, outs, mesh) -> list`` runs it on local shards laid out as ``ins``
    producing ``outs`` (``local.runs_unchanged`` where nothing changes); ``traits``."""

    primitive: str
    family: str  # the module that registered it
    rule: Rule
    cost: Callable
    fusion: Fusions
    local: Callable
    traits: Traits = NO_TRAITS

    @property
    def barrier(self) -> Barrier | None:
        return self.rule if isinstance(self.rule, Barrier) else None
