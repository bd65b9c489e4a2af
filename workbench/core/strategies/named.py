"""Named strategies: textbook partitionings as composite tactics over Tile/Replicate/Atomic.

Each takes the mesh axis it uses. What it acts on comes from the program's anatomy
(``Program.anatomy()``: data inputs and their batch dimension, parameters and their
optimizer state, attention and MLP projections, embeddings), read from structure alone;
a selector passed to a strategy overrides the anatomy, and a ``Role`` step in the schedule
corrects it. A strategy expands, given the state it applies to, into primitive tactics,
and ``expand`` is how you read what it does.

    [BP("batch"), MP("model"), Z3("batch")]
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.anatomy.blocks import block_interior, crossing, residual_stream
from workbench.core.errors import TacticError
from workbench.core.ir.selectors import exact, select
from workbench.core.propagate.tactics import Atomic, Replicate, Tactic, Tile, _check_axis


def _matches(program, selector) -> list[int]:
    return select(program, selector, required=False)


def _names(program, ids) -> list[str]:
    """Selectors for exactly these values (a name with glob characters stays one name)."""
    return [exact(program.values[i].name) for i in ids]


def roles(program, state):
    """The program's anatomy with the corrections the schedule so far made (``Role``)."""
    corrections = tuple(t for t in state.schedule if isinstance(t, Role))
    anatomy = program.anatomy()
    if not corrections:
        return anatomy
    resolved = tuple((r.role, tuple(select(program, r.selector)), r.dim) for r in corrections)
    return anatomy.corrected(resolved)


def _by_dim(program, mesh, state, axis, picks) -> list[Tactic]:
    """``Tile`` tactics for ``(value, dim)`` picks, one per dim in first-seen order; values the
    axis already sits on, or whose dim it does not divide, are left to propagation."""
    size = mesh.axis_size(axis)
    groups: dict[int, list[int]] = {}
    for vid, d in picks:
        v, sh = program.values[vid], state.shardings[vid]
        if d is None or sh.uses(axis) or axis in sh.replicated:
            continue
        d %= len(v.shape)
        if v.shape[d] % (sh.shards(d, mesh) * size) == 0 and vid not in groups.get(d, ()):
            groups.setdefault(d, []).append(vid)
    return [Tile(_names(program, ids), d, axis) for d, ids in groups.items()]


def _shard_dim(shape, sharding, mesh, axis) -> int | None:
    """The largest dim the axis still divides (ties: the later dim), or None."""
    size = mesh.axis_size(axis)
    best = None
    for d, n in enumerate(shape):
        if n % (sharding.shards(d, mesh) * size) == 0 and (best is None or n >= shape[best]):
            best = d
    return best


@dataclass(frozen=True, slots=True)
class BP(Tactic):
    """Batch (data) parallelism: every data input tiled on its batch dimension over ``axis``
    (or dim ``dim`` of the values ``inputs`` selects)."""

    axis: str
    inputs: str | None = None
    dim: int | None = None

    def __str__(self) -> str:
        if self.inputs is None and self.dim is None:
            return f"BP({self.axis!r})"
        return f"BP({self.axis!r}, inputs={self.inputs!r}, dim={self.dim})"

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        if self.inputs is not None:
            return [Tile(self.inputs, 0 if self.dim is None else self.dim, self.axis)]
        data = [(v, d if self.dim is None else self.dim) for v, d in roles(program, state).data]
        tiles = _by_dim(program, mesh, state, self.axis, data)
        if not any(d is not None for _, d in data):
            raise TacticError(
                f"{self}: the workbench sees no data input with a batch dimension in "
                f"{program.name} (program.anatomy() shows what it sees); pass inputs= and dim=, "
                "or apply Role(selector, 'data', dim=...) first."
            )
        return tiles


@dataclass(frozen=True, slots=True)
class MP(Tactic):
    """Megatron tensor parallelism: attention heads and the MLP hidden dim over ``axis``.

    Splits every up projection (queries, keys, values; MLP up and gate) on the hidden class
    it makes (heads first); propagation gives the output and down projections their input
    dim and makes their products pending sums. Attention fed by a fused projection split
    after its matmul keeps that kernel whole: its queries, keys and values are split by
    heads after the split (locally, no communication; the fused matmul is repeated on each
    device). ``heads``/``hidden`` selectors (with ``heads_dim``/``hidden_dim``) override.
    """

    axis: str
    heads: str | None = None
    hidden: str | None = None
    heads_dim: int = -2
    hidden_dim: int = -1

    def __str__(self) -> str:
        if (self.heads, self.hidden, self.heads_dim, self.hidden_dim) == (None, None, -2, -1):
            return f"MP({self.axis!r})"
        return (
            f"MP({self.axis!r}, heads={self.heads!r}, hidden={self.hidden!r}, "
            f"heads_dim={self.heads_dim}, hidden_dim={self.hidden_dim})"
        )

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        view = roles(program, state)
        if self.heads is not None:
            heads = [(v, self.heads_dim) for v in _matches(program, self.heads)]
        else:
            heads = view.heads_splits()
        if self.hidden is not None:
            hidden = [(v, self.hidden_dim) for v in _matches(program, self.hidden)]
        else:
            hidden = [] if self.heads is not None else view.hidden_splits()
        if not heads and not hidden:
            raise TacticError(
                f"{self}: the workbench sees no attention or MLP projection in {program.name} "
                "(program.anatomy() shows what it sees); pass heads=/hidden= selectors naming "
                "your attention projections and MLP input weights, or apply "
                "Role(selector, 'heads'|'hidden', dim=...) first."
            )
        return _by_dim(program, mesh, state, self.axis, heads) + _by_dim(
            program, mesh, state, self.axis, hidden
        )


def optimizer_inputs(program) -> list[int]:
    """Values made outside the optimizer phase that optimizer ops read (parameters, gradients)."""
    out = set()
    for op in program.ops:
        if op.phase != "optimizer":
            continue
        for v in op.operands:
            if isinstance(v, int):
                producer = program.values[v].producer
                if producer is None or program.ops[producer].phase != "optimizer":
                    out.add(v)
    return sorted(out)


def stacked_gradient(program, grad: int | None) -> list[int]:
    """The gradient and the loop result it is copied from (through linear one-operand ops of
    its shape, each read once), when a loop stacks it step by step; else nothing.

    Tiled like the parameter, each step's slice is reduce-scattered inside the loop as it is
    made (as the gradients of unrolled layers are), not stacked whole and reduced after it.
    """
    if grad is None:
        return []
    values, users = program.values, program.users
    chain, v = [grad], grad
    while (producer := values[v].producer) is not None:
        op = program.ops[producer]
        if op.regions:  # a scan's stacked per-step outputs follow its carries
            stacked = op.primitive == "scan" and op.results.index(v) >= op.params["num_carry"]
            return chain if stacked else []
        arrays = [u for u in op.operands if isinstance(u, int)]
        if len(arrays) != 1 or len(op.results) != 1 or (0,) not in program.mapping(op).linear:
            return []
        (v,) = arrays
        if values[v].shape != values[grad].shape or len(users[v]) != 1:
            return []
        chain.append(v)
    return []


def _gradient_readers(program, grad: int | None) -> list[int]:
    """What the update computes from a gradient, of its shape, one op on (a clipped gradient,
    its square for a global norm): tiled like the parameter, the gradient is
    reduce-scattered into each, never gathered whole for one of them."""
    if grad is None:
        return []
    shape, ops = program.values[grad].shape, program.ops
    return [
        r
        for o in program.users[grad]
        if ops[o].phase == "optimizer" and not ops[o].regions
        for r in ops[o].results
        if program.values[r].shape == shape
    ]


def _sharded_like_params(tactic, program, mesh, state, *, params: bool):
    """Tile each parameter's optimizer state (and, for Z3, the parameter itself) over the axis.

    First everything crossing into the optimizer (parameters, gradients) is made atomic on
    the axis, so the storage layout stays inside the optimizer: uses gather the parameter,
    and gradients are reduce-scattered (or sliced) into the sharded update.
    """
    view = roles(program, state)
    ids = view.parameters if tactic.params is None else _matches(program, tactic.params)
    if not ids:
        raise TacticError(
            f"{tactic}: "
            + (
                f"the workbench sees no parameter in {program.name} (program.anatomy() shows "
                "what it sees); pass params= naming your model's parameters."
                if tactic.params is None
                else f"{tactic.params!r} matches no value of {program.name}; pass params= "
                "naming your model's parameters."
            )
        )
    boundary = optimizer_inputs(program)
    if not boundary:  # no update: the parameters and their gradients
        boundary = list(ids) + [view.gradients[p] for p in ids if p in view.gradients]
    if params:  # the parameters themselves too, when the optimizer does not read them (it
        # may update a float32 master copy and cast it back: mixed precision)
        boundary = [*boundary, *ids]
    # a gradient a loop stacks crosses from the loop's result on: tiled there (below)
    stacked = {p: stacked_gradient(program, view.gradients.get(p)) for p in ids}
    boundary += [u for chain in stacked.values() for u in chain]
    out: list[Tactic] = [Atomic(_names(program, sorted(set(boundary))), tactic.axis)]
    tiles = []
    kept_whole = []
    for p in ids:
        v = program.values[p]
        d = _shard_dim(v.shape, state.shardings[p], mesh, tactic.axis) if v.shape else None
        new = view.new_params.get(p)
        related = [u for u in view.companions(p) if program.values[u].shape == v.shape]
        group = [p, *related] if params else [u for u in related if u != new]
        readers = _gradient_readers(program, view.gradients.get(p))
        group = list(dict.fromkeys([*group, *stacked[p], *readers]))
        group = [u for u in group if not state.shardings[u].uses(tactic.axis)]
        if d is None or not group:
            continue
        tiles.append(Tile(_names(program, group), d, tactic.axis))
        if params:  # inside loops, each step's slice stays sharded too: gathered per step
            for u, dropped in view.loop_slices.get(p, ()):
                if d >= dropped and not state.shardings[u].uses(tactic.axis):
                    out.append(Atomic(exact(program.values[u].name), tactic.axis))
                    tiles.append(Tile(exact(program.values[u].name), d - dropped, tactic.axis))
        elif new is not None:  # ZeRO-2 keeps parameters whole: the sharded update is gathered
            kept_whole.append(new)
    if kept_whole:
        out.append(Replicate(_names(program, kept_whole), tactic.axis))
    return out + tiles


@dataclass(frozen=True, slots=True)
class Z2(Tactic):
    """ZeRO-2: optimizer state sharded over ``axis`` (so gradients are reduce-scattered into
    it), parameters kept whole (the update is gathered back)."""

    axis: str
    params: str | None = None

    def __str__(self) -> str:
        return (
            f"Z2({self.axis!r})"
            if self.params is None
            else f"Z2({self.axis!r}, params={self.params!r})"
        )

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        return _sharded_like_params(self, program, mesh, state, params=False)


@dataclass(frozen=True, slots=True)
class Z3(Tactic):
    """ZeRO-3 / FSDP: every parameter and its optimizer state sharded over ``axis`` on its
    largest divisible dim; each use gathers it (the parameter is atomic on the axis, so its
    storage layout does not spread into the compute), gradients are reduce-scattered."""

    axis: str
    params: str | None = None

    def __str__(self) -> str:
        return (
            f"Z3({self.axis!r})"
            if self.params is None
            else f"Z3({self.axis!r}, params={self.params!r})"
        )

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        return _sharded_like_params(self, program, mesh, state, params=True)


@dataclass(frozen=True, slots=True)
class EMB(Tactic):
    """Embedding sharding: each embedding table on its vocabulary dim (``dim="vocab"``) or
    its feature dim (``"feature"``) over ``axis``; ``table`` selects tables (vocab on dim 0)."""

    axis: str
    dim: str = "vocab"
    table: str | None = None

    def __str__(self) -> str:
        return f"EMB({self.axis!r}, dim={self.dim!r}" + (
            f", table={self.table!r})" if self.table is not None else ")"
        )

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        if self.dim not in ("vocab", "feature"):
            raise TacticError(f"{self}: dim must be 'vocab' or 'feature'; got {self.dim!r}.")
        if self.table is not None:
            return [Tile(self.table, 0 if self.dim == "vocab" else -1, self.axis)]
        tables = roles(program, state).embeddings
        if not tables:
            raise TacticError(
                f"{self}: the workbench sees no embedding table in {program.name} (a parameter "
                "a gather looks rows up in); pass table=, or apply Role(selector, 'embedding', "
                "dim=<vocabulary dim>) first."
            )
        picks = []
        for t, vocab in tables:
            rank = len(program.values[t].shape)
            other = [d for d in range(rank) if d != vocab]
            picks.append((t, vocab if self.dim == "vocab" else (other[-1] if other else None)))
        return _by_dim(program, mesh, state, self.axis, picks)


@dataclass(frozen=True, slots=True)
class MQ(Tactic):
    """Multi-query attention: queries split on their heads over ``axis``, the shared key and
    value projections kept whole on it."""

    axis: str
    queries: str | None = None
    keys_values: str | None = None
    heads_dim: int = -2

    def __str__(self) -> str:
        if (self.queries, self.keys_values, self.heads_dim) == (None, None, -2):
            return f"MQ({self.axis!r})"
        return (
            f"MQ({self.axis!r}, queries={self.queries!r}, keys_values={self.keys_values!r}, "
            f"heads_dim={self.heads_dim})"
        )

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        view = roles(program, state)
        if self.queries is not None:
            queries = [(v, self.heads_dim) for v in _matches(program, self.queries)]
        else:
            queries = view.heads_splits(only="queries")
        kv = (
            _matches(program, self.keys_values)
            if self.keys_values is not None
            else view.keys_values()
        )
        if not queries:
            raise TacticError(
                f"{self}: the workbench sees no attention queries in {program.name}; pass "
                "queries= and keys_values= selectors."
            )
        kv = [v for v in kv if self.axis not in state.shardings[v].replicated]
        keep = [Replicate(_names(program, kv), self.axis)] if kv else []
        return keep + _by_dim(program, mesh, state, self.axis, queries)


ROLES = ("data", "parameter", "none", "embedding", "heads", "hidden")


@dataclass(frozen=True, slots=True)
class Role(Tactic):
    """A correction of what the workbench sees in the program, kept in the schedule like a
    tactic (undo, save and export rebuild it). ``role`` is one of ``ROLES``:

    - ``"data"``: the values are data inputs, batch on ``dim``;
    - ``"parameter"``: the values are parameters; ``"none"``: neither data nor parameter;
    - ``"embedding"``: embedding tables, vocabulary on ``dim``;
    - ``"heads"`` / ``"hidden"``: projections MP splits on ``dim`` (attention heads, MLP).

    It changes no sharding; the named strategies after it read the corrected roles.
    """

    selector: str | tuple
    role: str
    dim: int | None = None
    axis: str = ""

    def __post_init__(self):
        if isinstance(self.selector, list):
            object.__setattr__(self, "selector", tuple(self.selector))

    def __str__(self) -> str:
        sel = list(self.selector) if isinstance(self.selector, tuple) else self.selector
        return f"Role({sel!r}, {self.role!r}" + (
            f", dim={self.dim})" if self.dim is not None else ")"
        )

    def expand(self, program, mesh, state):
        if self.role not in ROLES:
            raise TacticError(f"{self}: role must be one of {list(ROLES)}; got {self.role!r}.")
        needs_dim = self.role in ("data", "embedding", "heads", "hidden")
        if needs_dim and (isinstance(self.dim, bool) or not isinstance(self.dim, int)):
            raise TacticError(
                f"{self}: role {self.role!r} needs dim=<the dimension it is about>; got {self.dim!r}."
            )
        for v in select(program, self.selector):
            shape = program.values[v].shape
            if needs_dim and not -len(shape) <= self.dim < len(shape):
                raise TacticError(
                    f"{self}: {program.values[v].name} has shape {shape}, so dim {self.dim} is "
                    f"out of range; use a dim in [{-len(shape)}, {len(shape) - 1}]."
                )
        return []


@dataclass(frozen=True, slots=True)
class SP(Tactic):
    """Sequence parallelism outside attention and MLP: the residual stream tiled on its
    sequence dim over ``axis``. Every activation crossing into or out of a block's interior
    (forward and backward; ``ir.blocks``) is atomic on the axis, so each block gathers its
    input and the sum it returns is reduce-scattered back onto the stream; those entering a
    block are tiled like the stream (in the backward pass, the cotangents). ``stream``
    selects the stream's values and ``dim`` their sequence dim, overriding the anatomy."""

    axis: str
    stream: str | None = None
    dim: int | None = None

    def __str__(self) -> str:
        if (self.stream, self.dim) == (None, None):
            return f"SP({self.axis!r})"
        return f"SP({self.axis!r}, stream={self.stream!r}, dim={self.dim})"

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        view = roles(program, state)
        inside = block_interior(view)
        boundary = crossing(program, inside)
        if self.stream is not None:
            stream = _matches(program, self.stream)
        else:  # what a block's result is added to (the residual sums) and the blocks' inputs
            stream = residual_stream(view, inside)
        seq = view.sequence_class
        if not stream or (self.dim is None and seq is None):
            raise TacticError(
                f"{self}: the workbench sees no residual stream with a sequence dimension in "
                f"{program.name} (program.anatomy() shows what it sees); pass stream= and dim=."
            )
        out = [Atomic(_names(program, boundary), self.axis)] if boundary else []
        shapes = {program.values[v].shape for v in stream}
        entering = [
            v
            for v in boundary
            if program.values[v].shape in shapes
            and program.values[v].producer not in inside
            and not state.shardings[v].uses(self.axis)
        ]

        def dim_of(v):
            if self.dim is not None:
                return self.dim
            dims = view.classes.dims_of(v, len(program.values[v].shape))
            return dims.index(seq) if seq in dims else None

        picks = [(v, dim_of(v)) for v in dict.fromkeys((*stream, *entering))]
        return out + _by_dim(program, mesh, state, self.axis, picks)


#: The named strategies by name, in the order a user meets them.
STRATEGIES: dict[str, type[Tactic]] = {
    "BP": BP,
    "MP": MP,
    "Z2": Z2,
    "Z3": Z3,
    "EMB": EMB,
    "SP": SP,
    "MQ": MQ,
}

#: Axis names each kind of strategy usually runs on, by convention.
DATA_AXES = ("batch", "data", "dp", "fsdp", "replica")
MODEL_AXES = ("model", "tensor", "tp", "mp", "heads")


def suggested_axis(strategy: str, mesh) -> str:
    """The mesh axis a named strategy runs on unless told otherwise: a data-like axis for
    BP, Z2 and Z3 (else the first axis), a model-like one for the rest (else the last)."""
    if strategy not in STRATEGIES:
        raise TacticError(
            f"unknown strategy {strategy!r}; the named strategies are {list(STRATEGIES)}."
        )
    data = strategy in ("BP", "Z2", "Z3")
    conventional = DATA_AXES if data else MODEL_AXES
    for name in mesh.names:
        if name.lower() in conventional:
            return name
    return mesh.names[0] if data else mesh.names[-1]
