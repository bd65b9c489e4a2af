"""What the workbench sees in a program, as findings people read: the anatomy's state and
data roles, then each attention, the MLP splits, the experts (router, experts, dispatch and
combine per mixture-of-experts layer), embeddings, output heads and blocks.
``report`` returns them as ``Findings``: a list that displays as a table of roles,
evidence and confidence."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from workbench.core import display as d


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the workbench sees: a role, the values in it, the dimension it is about."""

    role: str
    values: tuple[int, ...]
    dim: int | None
    evidence: str
    confidence: float


class Findings(list):
    """A list of ``Finding`` that reads as a table: role, values (the first named, from
    ``program``), dimension, confidence and evidence."""

    def __init__(self, items: Iterable[Finding] = (), program=None):
        super().__init__(items)
        self.program = program

    def _values(self, f: Finding, width: int = 32) -> str:
        if not f.values:
            return "none"
        first = f.values[0]
        if self.program is not None:
            first = d.clip_left(self.program.values[first].name, width)
        return f"{first}" + (f" +{len(f.values) - 1}" if len(f.values) > 1 else "")

    @staticmethod
    def _dim(f: Finding) -> str:
        return "" if f.dim is None else f"dim {f.dim}"

    def __repr__(self) -> str:
        head = f"Anatomy report: {len(self)} findings (role, values, dim, confidence, evidence)"
        rows = [
            (f.role, self._values(f, 24), self._dim(f), f"{f.confidence:.0%}", f.evidence)
            for f in self
        ]
        body = d.text_table(rows, (16, 30, 6, 4, 56))
        return d.lines(head, body, hint="each a Finding: report()[i]")

    def _repr_html_(self) -> str:
        rows = (
            (
                f.role,
                len(f.values),
                self._values(f, 48),
                self._dim(f),
                f"{f.confidence:.0%}",
                f.evidence,
            )
            for f in self
        )
        every = d.table(
            ("role", "value"),
            (
                (f.role, self.program.values[v].name if self.program is not None else v)
                for f in self
                for v in f.values
            ),
        )
        return d.panel(
            f"Anatomy report: {len(self)} findings",
            d.table(("role", "values", "first", "dim", "confidence", "evidence"), rows),
            d.details("every value of each finding", every),
        )


def report(anatomy) -> Findings:
    """The anatomy's findings, with its layers' (see the module docstring)."""
    layers = anatomy.layers
    out = [_current(anatomy, f) for f in anatomy.findings]
    for i, a in enumerate(layers.attention):
        members = (*a.queries, *a.keys, *a.values, *a.output)
        how = (
            "a fused projection split after its matmul: queries, keys and values are the "
            "activations entering the attention dots"
            if a.fused
            else "up projections whose output meets in a dot of two activations that carries "
            "it as a batch dimension (the heads), and a down projection contracting it"
        )
        out.append(Finding(f"attention {i}", members, None, how, 0.8 if a.fused else 0.9))
    mlp = anatomy.hidden_splits()
    if mlp:
        out.append(
            Finding(
                "mlp hidden",
                tuple(v for v, _ in mlp),
                mlp[0][1],
                "up projections into a class a down projection contracts, carried by no "
                "attention dot",
                0.9,
            )
        )
    out += _experts(anatomy)
    for table, vocab in anatomy.embeddings:
        out.append(
            Finding(
                "embedding",
                (table,),
                vocab,
                "a parameter a gather looks rows up in (the looked-up dimension is the vocabulary)",
                0.9,
            )
        )
    for head, vocab in layers.heads_out:
        out.append(
            Finding(
                "output head",
                (head,),
                vocab,
                "an up projection into a class no down projection contracts (the logits)",
                0.7,
            )
        )
    if layers.stacked:
        out.append(
            Finding(
                "repeated block",
                layers.stacked,
                0,
                f"parameters a loop slices per step ({layers.repeats} steps)",
                0.95,
            )
        )
    elif len(layers.blocks) > 1:
        out.append(
            Finding(
                "repeated block",
                layers.blocks[0],
                None,
                f"{len(layers.blocks)} blocks of parameters of the same shapes and kinds, in "
                "the order the forward pass reads them (the first shown)",
                0.85,
            )
        )
    return Findings(out, getattr(anatomy, "program", None))


_DISPATCH = {
    "einsum": "an einsum of the tokens with a one-hot dispatch tensor built from the decision",
    "gather": "a gather of the tokens into the experts' slots by indices from the decision",
    "ragged": "a gather of the tokens sorted by the decision into the grouped matmul's rows",
    "dense": "none: every expert sees every token, the gates mask the combine",
    "other": "an op meeting the tokens with the decision",
}


def _experts(anatomy) -> list[Finding]:
    """A router, experts, dispatch and combine finding per mixture-of-experts layer."""
    out, results = [], anatomy.program.ops
    for i, e in enumerate(anatomy.experts):
        sure = 0.9 if e.form in ("einsum", "gather", "ragged") else 0.75
        out.append(
            Finding(
                f"router {i}",
                (e.router,),
                e.router_dim,
                f"a projection of the residual stream into E={e.size} whose output reaches an "
                "op making integers (top_k, argmax, a sort): the choice of experts",
                sure,
            )
        )
        keeps = "a grouped matmul's groups" if e.form == "ragged" else "a matmul's batch dim"
        out.append(
            Finding(
                f"experts {i}",
                tuple(p for p, _ in e.experts),
                e.experts[0][1],
                f"parameters with a dim of size {e.size} kept per expert ({keeps}) while the "
                f"hidden dim is contracted; the router's choice reaches them ({e.form})",
                sure,
            )
        )
        for role, ids, how in (
            ("dispatch", e.dispatch, _DISPATCH[e.form]),
            ("combine", e.combine, "from the last expert matmul to the op weighting by the gates"),
        ):
            vals = tuple(results[o].results[0] for o in ids)
            out.append(Finding(f"{role} {i}", vals, None, how, sure if vals else 0.6))
    return out


def _current(anatomy, finding: Finding) -> Finding:
    """A stored finding with the values the schedule's corrections left (``Role`` steps)."""
    corrected = {role for role, _, _ in anatomy.corrections}
    if finding.role == "parameter" and corrected & {"parameter", "none", "data"}:
        values = anatomy.parameters
    elif finding.role == "data" and corrected & {"parameter", "none", "data"}:
        values = tuple(v for v, _ in anatomy.data)
    elif finding.role == "batch" and corrected & {"parameter", "none", "data"}:
        with_batch = [(v, d) for v, d in anatomy.data if d is not None]
        if set(v for v, _ in with_batch) == set(finding.values):
            return finding
        return Finding(
            "batch",
            tuple(v for v, _ in with_batch),
            with_batch[0][1] if with_batch else None,
            finding.evidence + "; corrected by Role steps of the schedule",
            1.0,
        )
    else:
        return finding
    if set(values) == set(finding.values):
        return finding
    return Finding(
        finding.role,
        tuple(values),
        finding.dim,
        finding.evidence + "; corrected by Role steps of the schedule",
        1.0,
    )
