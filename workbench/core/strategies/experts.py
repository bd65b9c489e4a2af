"""Expert parallelism: ``EP`` splits the experts of every mixture-of-experts layer over an
axis (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021), in the capacity
forms (a one-hot einsum or a gather dispatch) and the dropless one (grouped matmuls)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from workbench.core.errors import TacticError
from workbench.core.ops import record
from workbench.core.ops import traits as traits_of
from workbench.core.propagate.propagation import op_index
from workbench.core.propagate.tactics import Expansion, Fence, Tactic, Target, _check_axis
from workbench.core.strategies.base import by_dim, check_fields, strict_text
from workbench.core.strategies.named import register
from workbench.core.strategies.roles import roles

#: The MoE forms whose experts EP splits; the others are refused, saying why.
FORMS = ("einsum", "gather", "ragged")
REFUSED = {
    "dense": "every expert sees every token: split the experts' hidden dim with MP(axis)",
    "other": "the workbench does not recognise how its tokens reach the experts",
}
#: A dropless layer whose grouped matmuls keep their groups whole.
WHOLE_GROUPS = (
    "its grouped matmuls (ragged_dot) keep the groups whole (group sizes per batch row, "
    "[b, g], or groups cut along a batch dim), which EP does not split; EP splits the form "
    "with one [g] vector of group sizes (jax.lax.ragged_dot(rows, w, sizes)), or a capacity "
    "form (one-hot einsum or gather dispatch)"
)


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
    combine weights' gradient is gathered for the router's. In the dropless form each
    device runs each grouped matmul on its experts' rows (a block of the sorted rows at an
    offset the group sizes give), zeros elsewhere: a sum over the axis, all-reduced at the
    combine and, as the plan has no layout for "each device's rows", also where a
    nonlinearity reads it (the experts' hidden), forward and backward (one more than the
    textbook's per such hidden); the weight gradients stay split. Composed with ``BP`` on
    another axis, each expert sees the tokens of its data shard. With ``BP`` after it on
    the same axis (GShard's layout) the router and its masks take the tokens' split, and
    the dispatch and the combine re-split between tokens and experts: per MoE layer one
    all-to-all at each, forward and backward (the capacity forms; the dropless one would
    need a ragged all-to-all, and meets a conflict per layer instead). EP after a tactic
    that already splits the tokens on its axis is refused (the expert matmuls would meet
    the tokens' split as conflicts: twice GShard's all-to-alls); apply EP first.
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
            if layer.form == "ragged" and _whole_groups(program, layer):
                raise TacticError(
                    f"{self}: a MoE layer of {program.name} has the 'ragged' (dropless) form, "
                    f"but {WHOLE_GROUPS}."
                )
            if layer.size % size:
                works = [n for n in range(2, layer.size + 1) if layer.size % n == 0]
                raise TacticError(
                    f"{self}: a MoE layer of {program.name} has {layer.size} experts, which the "
                    f"{size}-way axis {self.axis!r} does not divide; use an axis of size "
                    f"{', '.join(map(str, works)) or '(none: a single expert)'}."
                )
        _refuse_split_tokens(self, program, state, layers)
        picks = [pick for layer in layers for pick in layer.experts]
        fence = Fence(
            self.axis, routing(program, layers), "the experts dim where it meets the tokens"
        )
        # the experts' optimizer state (float32 master weights, moments) and updates follow
        # their parameters: tiled with them (in the dropless form no activation carries the
        # experts dim to the gradients), unless an earlier tactic on the axis decided their
        # gradients as whole sums: then say so
        view = roles(program, state)
        why = (
            f"its expert's gradient reaches the optimizer whole on {self.axis!r}: an earlier "
            "tactic on the axis (BP, say) reduced it over the tokens first; apply EP before "
            "the tactics that split the tokens on this axis to shard it and save its memory"
        )
        follow = [
            (u, d)
            for v, d in picks
            for u in [*view.companions(v), view.new_params.get(v)]
            if u is not None and program.values[u].shape == program.values[v].shape
        ]
        tiles = by_dim(program, mesh, state, self.axis, picks + follow, "experts")
        follow = [u for u, _ in follow]
        parts = [fence] * bool(fence.held) + tiles
        return Expansion(parts, tiles.targets + [Target(u, why) for u in dict.fromkeys(follow)])


def _classes(program, layers) -> tuple[set, set]:
    """The layers' experts classes, and their tokens' (classes the dispatch ops contract or
    drop, other than the experts')."""
    classes, values = program.anatomy().classes, program.values
    experts, tokens = set(), set()
    for layer in layers:
        experts |= layer.classes
        for o in layer.dispatch:
            op = program.ops[o]
            ins = {
                c
                for v in op.operands
                if isinstance(v, int)
                for c in classes.dims_of(v, len(values[v].shape))
            }
            outs = {c for v in op.results for c in classes.dims_of(v, len(values[v].shape))}
            tokens |= ins - outs - layer.classes
    return experts, tokens


def _refuse_split_tokens(ep, program, state, layers) -> None:
    """Raise where an earlier tactic already splits, on ``ep``'s axis, a tensor of tokens
    (one carrying a class the dispatch drops) that a dispatch op of ``layers`` reads."""
    classes, values = program.anatomy().classes, program.values
    _, tokens = _classes(program, layers)
    for layer in layers:
        for o in layer.dispatch:
            for v in program.ops[o].operands:
                if not isinstance(v, int):
                    continue
                dims = classes.dims_of(v, len(values[v].shape))
                d = state.shardings[v].dim_of(ep.axis)
                if d is None or not tokens.intersection(dims):
                    continue
                why = state.provenance.get((v, ep.axis))
                by = state.schedule[why.tactic] if why is not None else "an earlier tactic"
                raise TacticError(
                    f"{ep} given after {by}: the tokens of a MoE layer of {program.name} "
                    f"({values[v].name}, dim {d}) are already split on {ep.axis!r} by {by}, "
                    "so the expert matmuls would meet them as conflicts: twice GShard's "
                    "all-to-alls per layer each way. Apply "
                    f"{ep} first and {by} after it (GShard's layout: one all-to-all at the "
                    f"dispatch and one at the combine): undo {by}, apply {ep}, reapply {by}."
                )


def _whole_groups(program, layer) -> bool:
    """Whether a grouped matmul of ``layer`` reads an expert parameter on a blocked factor
    (its groups kept whole: per-row group sizes, or groups along a batch dim)."""
    origin = program.anatomy().layers.origin
    params = {p for p, _ in layer.experts}
    for op in program.ops:
        if op.phase != "forward" or op.regions or traits_of(op.primitive).contraction:
            continue
        mapping = program.mappings[op.id]
        blocked = [
            f in mapping.blocked
            for i, v in enumerate(op.operands)
            if isinstance(v, int) and origin.get(v) in params
            for d in mapping.operands[i]
            for f in d
        ]
        if len(op.operands) >= 3 and any(blocked):
            return True
    return False


def routing(program, layers) -> tuple[tuple[int, int], ...]:
    """(op, factor) pairs where the experts dim meets the tokens: the ops (of every phase)
    with a tensor carrying an experts dim beside one that carries none (not a scalar) or
    one carrying a dim of the tokens (a class the dispatch ops contract or drop), each with
    its factors on the experts' dims that another of its tensors carries too: the router's,
    the dispatch and the combine, in any of their forms (a one-hot einsum; a gather by slot
    indices, and the padding row its combine gathers dropped tokens from). Fenced, the
    experts split stays on the expert side: with tokens split on the same axis the router
    and its masks keep the tokens' split, and the dispatch and combine re-split (the
    all-to-alls of GShard) instead of meeting as conflicts. A matmul's factor one tensor
    alone carries (a grouped matmul's groups) spreads nowhere and is not held; elsewhere it
    is (the padding row concatenated to the experts' outputs)."""
    classes = program.anatomy().classes
    values = program.values
    index = op_index(program)

    def dims(v):
        return classes.dims_of(v, len(values[v].shape))

    experts, tokens = _classes(program, layers)
    held = []
    for op in program.ops:
        ix = index[op.id]
        carried = [(t, dims(v)) for t, v in enumerate(ix.tensors) if v >= 0 and values[v].shape]
        split = [t for t, cs in carried if experts.intersection(cs)]
        if not split or (
            len(split) == len(carried) and not any(tokens.intersection(cs) for _, cs in carried)
        ):
            continue
        count = Counter(f for t, _ in carried for f in {f for d in ix.dims[t] for f in d})
        matmul = record(op.primitive).family == "dot"  # a grouped matmul's own groups
        factors = {
            f
            for t, cs in carried
            for d, c in enumerate(cs)
            if c in experts
            for f in ix.dims[t][d]
            if count[f] > 1 or not matmul
        }
        held += [(op.id, f) for f in sorted(factors)]
    return tuple(held)
