"""Expert parallelism: ``EP`` splits the experts of every mixture-of-experts layer over an
axis (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021)."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import TacticError
from workbench.core.propagate.propagation import op_index
from workbench.core.propagate.tactics import Expansion, Fence, Tactic, Target, _check_axis
from workbench.core.strategies.base import by_dim, check_fields, strict_text
from workbench.core.strategies.named import register
from workbench.core.strategies.roles import roles

#: The MoE forms whose experts EP splits; the others are refused, saying why.
FORMS = ("einsum", "gather")
REFUSED = {
    "ragged": (
        "its experts run as grouped matmuls (ragged_dot) over rows sorted by expert, and the "
        "group sizes are known only at run time, so no static split of the rows follows the "
        "experts; rewrite the layer with a capacity (one-hot einsum or gather dispatch)"
    ),
    "dense": "every expert sees every token: split the experts' hidden dim with MP(axis)",
    "other": "the workbench does not recognise how its tokens reach the experts",
}


@register(axes="expert", place=8)
@dataclass(frozen=True, slots=True)
class EP(Tactic):
    """Expert parallelism over ``axis``: every MoE layer's expert parameters (each read from
    ``program.anatomy().experts``) tiled on their experts dim, so each device holds and runs
    ``E / n`` of the experts; propagation carries the split to the dispatched tokens, the
    experts' activations and their outputs, and no further: the ops where the experts dim
    meets the tokens (the router's, the dispatch and combine, of every pass) hold it on
    the axis (a ``Fence``, see `routing`).

    With the tokens whole on the axis each device selects its experts' tokens locally (no
    communication) and the combine sums over the experts (an all-reduce, or a
    reduce-scatter where the stream is split next); backward, each device's part of the
    combine weights' gradient is gathered for the router's. Composed with ``BP`` on another
    axis, each expert sees the tokens of its data shard. With ``BP`` after it on the same
    axis (GShard's layout) the router and its masks take the tokens' split, and the
    dispatch and the combine re-split between tokens and experts: per MoE layer one
    all-to-all at each, forward and backward. With ``BP`` first on the axis the experts'
    activations are already split by token group, so the expert matmuls meet as
    conflicts, which the lowering resolves with all-to-alls around each of them (twice
    the textbook's); and the experts' gradients are whole sums over the tokens, so their
    optimizer state stays whole (each such value is a note of the step). Apply EP first.
    """

    axis: str
    strict: bool = False  # any value it targets left whole is an error

    def __post_init__(self):
        check_fields(self)

    def __str__(self) -> str:
        return strict_text(self, f"EP({self.axis!r})")

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        layers = program.anatomy().experts
        if not layers:
            raise TacticError(
                f"{self}: the workbench sees no mixture of experts in {program.name} (a router "
                "whose output picks experts by top_k, argmax or a sort, and parameters stacked "
                "on an experts dim that matmuls keep per expert); program.anatomy().experts "
                "shows what it sees. For a dense model split the MLP with MP(axis), or the "
                "batch with BP(axis)."
            )
        size = mesh.axis_size(self.axis)
        for layer in layers:
            if layer.form not in FORMS:
                raise TacticError(
                    f"{self}: a MoE layer of {program.name} has the {layer.form!r} form, which "
                    f"EP does not split: {REFUSED.get(layer.form, REFUSED['other'])}."
                )
            if layer.size % size:
                works = [n for n in range(2, layer.size + 1) if layer.size % n == 0]
                raise TacticError(
                    f"{self}: a MoE layer of {program.name} has {layer.size} experts, which the "
                    f"{size}-way axis {self.axis!r} does not divide; use an axis of size "
                    f"{', '.join(map(str, works)) or '(none: a single expert)'}."
                )
        picks = [pick for layer in layers for pick in layer.experts]
        fence = Fence(
            self.axis, routing(program, layers), "the experts dim where it meets the tokens"
        )
        tiles = by_dim(program, mesh, state, self.axis, picks, "experts")
        # the experts' optimizer state and updates follow their parameters, unless an
        # earlier tactic on the axis decided their gradients as whole sums: then say so
        view = roles(program, state)
        why = (
            f"its expert's gradient reaches the optimizer whole on {self.axis!r}: an earlier "
            "tactic on the axis (BP, say) reduced it over the tokens first; apply EP before "
            "the tactics that split the tokens on this axis to shard it and save its memory"
        )
        follow = [
            u
            for v, _ in picks
            for u in [*view.companions(v), view.new_params.get(v)]
            if u is not None and program.values[u].shape == program.values[v].shape
        ]
        parts = [fence] * bool(fence.held) + tiles
        return Expansion(parts, tiles.targets + [Target(u, why) for u in dict.fromkeys(follow)])


def routing(program, layers) -> tuple[tuple[int, int], ...]:
    """(op, factor) pairs where the experts dim meets the tokens: the ops (of every phase)
    with a tensor carrying an experts dim beside one that carries none (not a scalar) or
    one carrying a dim of the tokens (a class the dispatch ops contract or drop), each with
    its factors on the experts' dims: the router's, the dispatch and the combine, in any
    of their forms (a one-hot einsum; a gather by slot indices, and the padding row its
    combine gathers dropped tokens from). Fenced, the experts split stays on the expert
    side: with tokens split on the same axis the router and its masks keep the tokens'
    split, and the dispatch and combine re-split (the all-to-alls of GShard) instead of
    meeting as conflicts."""
    classes = program.anatomy().classes
    values = program.values
    index = op_index(program)

    def dims(v):
        return classes.dims_of(v, len(values[v].shape))

    experts, tokens = set(), set()
    for layer in layers:
        experts |= layer.classes
        for o in layer.dispatch:
            op = program.ops[o]
            ins = {c for v in op.operands if isinstance(v, int) for c in dims(v)}
            outs = {c for v in op.results for c in dims(v)}
            tokens |= ins - outs - layer.classes
    held = []
    for op in program.ops:
        ix = index[op.id]
        carried = [(t, dims(v)) for t, v in enumerate(ix.tensors) if v >= 0 and values[v].shape]
        split = [t for t, cs in carried if experts.intersection(cs)]
        if not split or (
            len(split) == len(carried) and not any(tokens.intersection(cs) for _, cs in carried)
        ):
            continue
        factors = {
            f for t, cs in carried for d, c in enumerate(cs) if c in experts for f in ix.dims[t][d]
        }
        held += [(op.id, f) for f in sorted(factors)]
    return tuple(held)
