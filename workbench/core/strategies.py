"""Named strategies: textbook partitionings as composite tactics over Tile/Replicate/Atomic.

Each takes the mesh axis it uses and selectors naming the values it is about, with
defaults that fit the zoo's models (and any model with the same weight names); pass
your own selectors for other models. A strategy expands, given the state it applies
to, into primitive tactics, and ``expand`` is how you read what it does.

    [BP("batch"), MP("model"), Z3("batch")]
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import TacticError
from workbench.core.ir.selectors import select
from workbench.core.tactics import Atomic, Replicate, Tactic, Tile

#: Default selectors, matching the zoo's names.
BATCH = "batch/**"
PARAMS = "params/**"
ATTN_QKV = "params/**/attn/w{q,k,v}"
MLP_IN = "params/**/mlp/w_in"
EMBED = "params/**/embed"


def _matches(program, selector) -> list[int]:
    return select(program, selector, required=False)


def _names(program, ids) -> list[str]:
    return [program.values[i].name for i in ids]


def companions(program, param: int) -> list[int]:
    """Values shaped like a parameter and named after it: its optimizer moments, its update
    and its gradient (``opt_state/m/<path>``, ``out/params/<path>``, ``grads/<path>``...)."""
    v = program.values[param]
    path = v.name.split("/", 1)[1] if "/" in v.name else v.name
    return [
        u.id
        for u in program.values
        if u.id != param
        and u.shape == v.shape
        and u.region_of is None
        and u.name.endswith("/" + path)
    ]


def loop_slices(program, param: int) -> list[tuple[int, int]]:
    """``(region input, dims dropped)`` for each loop body input standing for ``param``: its
    per-step slice (``x[...]``, one dim fewer) or the whole of it (``const[...]``)."""
    v = program.values[param]
    out = []
    for u in program.values:
        if u.kind == "region_input" and u.name.endswith(f"[{v.name}]"):
            if u.shape == v.shape:
                out.append((u.id, 0))
            elif u.shape == v.shape[1:]:
                out.append((u.id, 1))
    return out


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
    """Batch (data) parallelism: tile dim ``dim`` of the inputs ``inputs`` selects over ``axis``."""

    axis: str
    inputs: str = BATCH
    dim: int = 0

    def __str__(self) -> str:
        return (
            f"BP({self.axis!r})"
            if (self.inputs, self.dim) == (BATCH, 0)
            else (f"BP({self.axis!r}, inputs={self.inputs!r}, dim={self.dim})")
        )

    def expand(self, program, mesh, state):
        return [Tile(self.inputs, self.dim, self.axis)]


@dataclass(frozen=True, slots=True)
class MP(Tactic):
    """Megatron tensor parallelism: attention heads and the MLP hidden dim over ``axis``.

    Tiles dim ``heads_dim`` of the Q/K/V projections and dim ``hidden_dim`` of the MLP's
    first weight; propagation gives the output projections their input dim and makes their
    products pending sums. Either selector may match nothing, not both.
    """

    axis: str
    heads: str = ATTN_QKV
    hidden: str = MLP_IN
    heads_dim: int = -2
    hidden_dim: int = -1

    def __str__(self) -> str:
        if (self.heads, self.hidden, self.heads_dim, self.hidden_dim) == (ATTN_QKV, MLP_IN, -2, -1):
            return f"MP({self.axis!r})"
        return (
            f"MP({self.axis!r}, heads={self.heads!r}, hidden={self.hidden!r}, "
            f"heads_dim={self.heads_dim}, hidden_dim={self.hidden_dim})"
        )

    def expand(self, program, mesh, state):
        out = []
        if _matches(program, self.heads):
            out.append(Tile(self.heads, self.heads_dim, self.axis))
        if _matches(program, self.hidden):
            out.append(Tile(self.hidden, self.hidden_dim, self.axis))
        if not out:
            raise TacticError(
                f"{self}: neither {self.heads!r} nor {self.hidden!r} matches a value of {program.name}; "
                "pass heads=/hidden= selectors naming your attention projections and MLP input weights."
            )
        return out


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


def _sharded_like_params(tactic, program, mesh, state, *, params: bool):
    """Tile each parameter's optimizer moments (and, for Z3, the parameter itself) over the axis.

    First everything crossing into the optimizer (parameters, gradients) is made atomic on
    the axis, so the storage layout stays inside the optimizer: uses gather the parameter,
    and gradients are reduce-scattered (or sliced) into the sharded update.
    """
    ids = _matches(program, tactic.params)
    if not ids:
        raise TacticError(
            f"{tactic}: {tactic.params!r} matches no value of {program.name}; pass params= "
            "naming your model's parameters."
        )
    boundary = optimizer_inputs(program)
    if not boundary:  # no optimizer scope: the parameters and the tagged gradients
        boundary = ids + [
            u
            for p in ids
            for u in companions(program, p)
            if program.values[u].name.startswith("grads/")
        ]
    if params:  # the parameters themselves too, when the optimizer does not read them (it
        # may update a float32 master copy and cast it back: mixed precision)
        boundary = [*boundary, *ids]
    out: list[Tactic] = [Atomic(_names(program, sorted(set(boundary))), tactic.axis)]
    tiles = []
    kept_whole = []
    for p in ids:
        v = program.values[p]
        d = _shard_dim(v.shape, state.shardings[p], mesh, tactic.axis) if v.shape else None
        related = [
            u for u in companions(program, p) if not program.values[u].name.startswith("grads/")
        ]
        group = (
            [p, *related]
            if params
            else [u for u in related if "opt_state" in program.values[u].name]
        )
        group = [u for u in group if not state.shardings[u].uses(tactic.axis)]
        if d is None or not group:
            continue
        tiles.append(Tile(_names(program, group), d, tactic.axis))
        if params:  # inside loops, each step's slice stays sharded too: gathered per step
            for u, dropped in loop_slices(program, p):
                if d >= dropped and not state.shardings[u].uses(tactic.axis):
                    out.append(Atomic(program.values[u].name, tactic.axis))
                    tiles.append(Tile(program.values[u].name, d - dropped, tactic.axis))
        if not params:  # ZeRO-2 keeps parameters whole: the sharded update is gathered back
            kept_whole += [u for u in related if program.values[u].name.startswith("out/params")]
    if kept_whole:
        out.append(Replicate(_names(program, kept_whole), tactic.axis))
    return out + tiles


@dataclass(frozen=True, slots=True)
class Z2(Tactic):
    """ZeRO-2: optimizer moments sharded over ``axis`` (so gradients are reduce-scattered into
    them), parameters kept whole (the update is gathered back)."""

    axis: str
    params: str = PARAMS

    def __str__(self) -> str:
        return (
            f"Z2({self.axis!r})"
            if self.params == PARAMS
            else f"Z2({self.axis!r}, params={self.params!r})"
        )

    def expand(self, program, mesh, state):
        return _sharded_like_params(self, program, mesh, state, params=False)


@dataclass(frozen=True, slots=True)
class Z3(Tactic):
    """ZeRO-3 / FSDP: every parameter and its optimizer moments sharded over ``axis`` on its
    largest divisible dim; each use gathers it (the parameter is atomic on the axis, so its
    storage layout does not spread into the compute), gradients are reduce-scattered."""

    axis: str
    params: str = PARAMS

    def __str__(self) -> str:
        return (
            f"Z3({self.axis!r})"
            if self.params == PARAMS
            else f"Z3({self.axis!r}, params={self.params!r})"
        )

    def expand(self, program, mesh, state):
        return _sharded_like_params(self, program, mesh, state, params=True)


@dataclass(frozen=True, slots=True)
class EMB(Tactic):
    """Embedding sharding: the table on its vocab dim (0) or feature dim (1) over ``axis``."""

    axis: str
    dim: str = "vocab"
    table: str = EMBED

    def __str__(self) -> str:
        return f"EMB({self.axis!r}, dim={self.dim!r})" + (
            f", table={self.table!r})" if self.table != EMBED else ""
        )

    def expand(self, program, mesh, state):
        if self.dim not in ("vocab", "feature"):
            raise TacticError(f"{self}: dim must be 'vocab' or 'feature'; got {self.dim!r}.")
        return [Tile(self.table, 0 if self.dim == "vocab" else -1, self.axis)]


@dataclass(frozen=True, slots=True)
class MQ(Tactic):
    """Multi-query attention: queries tiled on their heads over ``axis``, the shared K/V
    projections kept whole on it."""

    axis: str
    queries: str = "params/**/attn/wq"
    keys_values: str = "params/**/attn/w{k,v}"
    heads_dim: int = -2

    def __str__(self) -> str:
        return f"MQ({self.axis!r})"

    def expand(self, program, mesh, state):
        return [
            Replicate(self.keys_values, self.axis),
            Tile(self.queries, self.heads_dim, self.axis),
        ]


def scope_boundary(program, inside: tuple[str, ...]) -> list[int]:
    """Activations crossing into or out of ops whose scope names one of ``inside``."""

    def within(op_id) -> bool:
        return op_id is not None and bool(set(program.ops[op_id].scope) & set(inside))

    out = set()
    for op in program.ops:
        for v in op.operands:
            crossing = isinstance(v, int) and program.values[v].kind == "intermediate"
            if crossing and within(op.id) != within(program.values[v].producer):
                out.add(v)
    return sorted(out)


@dataclass(frozen=True, slots=True)
class SP(Tactic):
    """Sequence parallelism outside attention and MLP: the residual stream and layer-norm
    outputs tiled on the sequence dim over ``axis``. Every activation crossing into or out of
    the ``inside`` scopes (forward and backward) is atomic on the axis, so each block gathers
    its input and the sum it returns is reduce-scattered back onto the stream; those entering
    a block are tiled like the stream (in the backward pass, the cotangents)."""

    axis: str
    stream: str = "**/{resid_in,resid_mid,attn_in,mlp_in}"
    inside: tuple[str, ...] = ("attn", "mlp")
    dim: int = 1

    def __str__(self) -> str:
        return f"SP({self.axis!r})"

    def expand(self, program, mesh, state):
        if not _matches(program, self.stream):
            raise TacticError(
                f"{self}: {self.stream!r} matches no value of {program.name}; tag your residual "
                "stream and block inputs with workbench.tag and pass stream=."
            )
        boundary = scope_boundary(program, self.inside)
        out = [Atomic(_names(program, boundary), self.axis)] if boundary else []
        # what leaves the stream for a block (in the backward pass too) is tiled like the stream
        shapes = {program.values[v].shape for v in _matches(program, self.stream)}
        inside = set(self.inside)
        entering = [
            v
            for v in boundary
            if program.values[v].shape in shapes
            and not set(program.ops[program.values[v].producer].scope) & inside
            and not state.shardings[v].uses(self.axis)
        ]
        selector = [self.stream, *_names(program, entering)]
        return [*out, Tile(selector, self.dim, self.axis)]


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
