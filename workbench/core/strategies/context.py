"""Context parallelism: ``CP`` splits every activation on its sequence dim, and gathers the
keys and values only where attention reads them (the all-gather variant of Llama 3's and
Megatron's context parallelism), or passes them around a ring (Liu et al. 2023, "Ring
Attention")."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.anatomy.attention import (
    keys_values,
    query_rows,
    reached,
    recomputed,
    region,
    rows_of,
)
from workbench.core.anatomy.masks import hidden_blocks
from workbench.core.errors import TacticError, given
from workbench.core.propagate.propagation import op_index
from workbench.core.propagate.tactics import (
    Atomic,
    Fence,
    Tactic,
    TacticInputError,
    _check_axis,
)
from workbench.core.strategies.base import by_dim, check_fields, names_of, strict_text
from workbench.core.strategies.named import register
from workbench.core.strategies.roles import roles

KINDS = ("all-gather", "ring")


@register(axes="context", place=9)
@dataclass(frozen=True, slots=True)
class CP(Tactic):
    """Context parallelism over ``axis``: the data inputs tiled on their sequence dim (the
    class attention carries twice, or ``dim``), so every activation is split on it.

    Each device projects the keys and values of its own part of the sequence; the ops that
    read them (each attention's dots, of every pass, its recomputation under remat
    included) hold their sequence factor on the axis (a ``Fence``), so the plan gathers
    them there and nowhere else: forward, an all-gather of the keys and of the values per
    attention; backward, the same again where the gradients read them (the gathered copies
    are not kept) and a reduce-scatter of each of their gradients, sums over the split
    queries. The probabilities are split on their queries first, and the key positions
    of a mask added to the scores (``key_positions``) stay whole, so a causal or padding
    mask is split on its queries only. The weight gradients, sums over the split sequence,
    are reduced over the axis as data parallelism's are.

    ``kind="ring"`` (ring attention) gathers nothing: each attention runs as a ring over
    the axis (``plan/rings.py``, ``lowering/ring.py``), its keys and values passed on
    ``C - 1`` times and folded into an online softmax; backward the blocks replayed, the
    keys and values passed again and their gradients ``C`` times (the last hop home); under
    remat the recomputation's output is the forward ring's, kept, and the backward ring
    reads the recomputed queries, keys and values. An attention inside a loop, or with
    anything but a softmax between its dots (a dropout), is refused, saying why; so is a
    pipelined step.

    ``balance=True`` (with ``kind="ring"``) balances a causal ring: the sequence is cut
    into ``2C`` chunks and device ``i`` holds chunks ``i`` and ``2C - 1 - i``, so every
    device skips about half of each block its mask hides and no step waits on one device
    (``plan/zigzag.py``; the plan says where it cannot, and keeps the order).
    """

    axis: str
    kind: str = "all-gather"
    dim: int | None = None
    strict: bool = False  # any value it targets left whole is an error
    balance: bool = False  # a ring's sequence in the balanced (zigzag) order

    def __post_init__(self):
        check_fields(self, optional_dims=("dim",))
        if self.kind not in KINDS:
            raise TacticInputError(
                f"{self}: kind must be 'all-gather' or 'ring'; got {given(self.kind)}."
            )
        if self.balance not in (True, False):
            raise TacticInputError(
                f"{self}: balance must be True or False; got {given(self.balance)}."
            )
        if self.balance and self.kind != "ring":
            raise TacticInputError(
                f"{self}: balance=True balances a ring's blocks; use "
                f"CP({self.axis!r}, kind='ring', balance=True)."
            )

    @property
    def ring(self) -> str | None:
        """The axis whose keys and values pass around a ring (``kind="ring"``), else None."""
        return self.axis if self.kind == "ring" else None

    def __str__(self) -> str:
        extra = [f"kind={self.kind!r}"] * (self.kind != "all-gather")
        extra += [f"dim={self.dim}"] * (self.dim is not None)
        extra += ["balance=True"] * (self.balance is True)
        return strict_text(self, f"CP({', '.join([repr(self.axis), *extra])})")

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        view = roles(program, state)
        attention = view.layers.attention
        if not attention:
            raise TacticError(
                f"{self}: the workbench sees no attention in {program.name} (a dot of queries "
                "and keys whose result, through a softmax, meets the values in a second dot); "
                "with nothing to exchange, split the sequence with BP(axis, dim=<its dim>), or "
                "the batch with BP(axis)."
            )
        if self.kind == "ring":
            if state.pipeline is not None:
                raise TacticError(
                    f"{self}: the step is pipelined ({state.pipeline}), and a pipelined step "
                    f"does not run ring attention yet; use CP({self.axis!r}), which gathers the "
                    "keys and values inside attention."
                )
            for a in attention:
                why = region(program, a.scores, a.context)
                if isinstance(why, str):
                    raise TacticError(
                        f"{self}: the attention at {program.ops[a.scores].name} cannot run as a "
                        f"ring: {why}; use CP({self.axis!r}) (kind='all-gather'), which gathers "
                        "its keys and values instead."
                    )
        seq = view.sequence_class

        def dim_of(v):
            if self.dim is not None:
                return self.dim
            dims = view.classes.dims_of(v, len(program.values[v].shape))
            return dims.index(seq) if seq is not None and seq in dims else None

        picks = [(v, dim_of(v)) for v, _ in view.data]
        if not any(d is not None for _, d in picks):
            raise TacticError(
                f"{self}: the workbench sees no data input with a sequence dimension in "
                f"{program.name} (the dim its attention carries twice; program.anatomy() shows "
                "what it sees); pass dim=<the data inputs' sequence dim>, or split the batch "
                "with BP(axis)."
            )
        pairs = [(a.scores, a.context) for a in attention]
        pairs += recomputed(program, list(pairs))
        exchanged = {v for pair in pairs for v in keys_values(program, *pair)}
        fence = Fence(
            self.axis,
            gathered_at(program, view, exchanged),
            "the keys' and values' sequence where attention reads them",
        )
        positions = [v for pair in pairs for v in key_positions(program, *pair)]
        kept = [
            v for v in dict.fromkeys(positions) if self.axis not in state.shardings[v].replicated
        ]
        keep = [Atomic(names_of(program, kept), self.axis)] if kept else []
        # the probabilities split on their queries first: a keys' gradient tiled on its
        # sequence (from a weight gradient) must not reach them through the values' gradient
        rows = [r for pair in pairs if (r := query_rows(program, *pair)) is not None]
        first = by_dim(program, mesh, state, self.axis, rows, "queries") if rows else []
        fenced = [fence] if fence.held else []
        return fenced + keep + first + by_dim(program, mesh, state, self.axis, picks, "sequence")


def context_moves(program, mesh, axis: str) -> list[CP]:
    """The ring a search tries on ``axis`` beside ``CP(axis)`` (`ring_for`): where the axis
    has devices to pass blocks around and every attention can run as a ring."""
    attention = program.anatomy().layers.attention
    if mesh.axis_size(axis) < 2 or not attention:
        return []
    if any(isinstance(region(program, a.scores, a.context), str) for a in attention):
        return []
    return [ring_for(program, mesh, axis)]


def ring_for(program, mesh, axis: str) -> CP:
    """The ring attention a user would want on ``axis``: balanced where a mask read from
    the program hides whole pairs of chunks of the sequence (a causal mask), for then
    every device skips its share alike; else in order."""
    c = mesh.axis_size(axis)
    for a in program.anatomy().layers.attention:
        r, rows = region(program, a.scores, a.context), query_rows(program, a.scores, a.context)
        if isinstance(r, str) or rows is None or c < 2:
            continue
        hidden = hidden_blocks(program, r.forward, rows[1], 2 * c)
        if hidden is not None and hidden.any():
            return CP(axis, kind="ring", balance=True)
    return CP(axis, kind="ring")


def gathered_at(program, view, exchanged) -> tuple[tuple[int, int], ...]:
    """(op, factor): each op reading the keys or values (of every phase) with the factor on
    their sequence dim, which it never spreads: the keys and values stay split where they
    are made, and each such op gathers them."""
    index = op_index(program)
    seq = view.sequence_class
    held = []
    for v in sorted(exchanged):
        dims = view.classes.dims_of(v, len(program.values[v].shape))
        if seq not in dims:
            continue
        d = dims.index(seq)
        for o in dict.fromkeys(program.users[v]):
            ix = index[o]
            held += [(o, f) for t, x in enumerate(ix.tensors) if x == v for f in ix.dims[t][d]]
    return tuple(dict.fromkeys(held))


def key_positions(program, scores: int, context: int) -> list[int]:
    """Arrays that index the keys alone in a mask or bias added to the scores (a causal
    mask compares query positions with key positions, both of the split sequence): walked
    back from what meets the scores, through broadcasts and elementwise ops, to values
    whose query dim is 1 and whose key dim is not. Kept whole with the keys (they are
    small), the mask is split on its queries only; split, it would be split on both."""
    op, ctx = program.ops[scores], program.ops[context]
    reach, probs = reached(program, scores, context)
    rows = rows_of(program, ctx, probs)
    if rows is None:
        return []
    (i,) = probs
    t_dim = rows[1]
    contracted = ctx.params["dimension_numbers"][0][i]
    if len(contracted) != 1:  # the keys' dim: one, or no mask to follow
        return []
    (s_dim,) = contracted
    shape = program.values[rows[0]].shape
    sides = [
        x
        for v in reach
        if program.values[v].shape == shape
        for u in program.users[v]
        if u != context and program.ops[u].phase == op.phase
        for x in program.ops[u].operands
        if isinstance(x, int) and x not in reach and len(program.values[x].shape) == len(shape)
    ]
    out, todo, seen = [], [(x, t_dim, s_dim, 0) for x in sides], set()
    while todo:
        v, t, s, depth = todo.pop()
        if (v, t, s) in seen or depth > 16:
            continue
        seen.add((v, t, s))
        vshape = program.values[v].shape
        if vshape[s] > 1 and (t is None or vshape[t] == 1):
            out.append(v)
            continue
        made = program.values[v].producer
        if made is None:
            continue
        m = program.mappings[made]  # a dim of v and an operand's dim align where they
        r = program.ops[made].results.index(v)  # share their factors
        for x, dims in zip(program.ops[made].operands, m.operands):
            if not isinstance(x, int):
                continue
            at = {tuple(f): d for d, f in enumerate(dims) if f}
            ft = tuple(m.results[r][t]) if t is not None else ()
            fs = tuple(m.results[r][s])
            if fs and fs in at and not set(fs) & m.blocked:
                todo.append((x, at.get(ft) if ft else None, at[fs], depth + 1))
    return list(dict.fromkeys(out))
