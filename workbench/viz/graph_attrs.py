"""The DOT attributes of ``program_graph``'s nodes and edges: labels, tooltips, colours,
and the ids and classes that make the SVG addressable (``wb-op``, ``wb-box``, ``wb-io``,
``wb-collective``, ``wb-value``). A mixin of the drawing in ``graph.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from workbench.core.ir.program import Op
from workbench.core.ir.source_lines import where
from workbench.core.layout.collectives import Collective
from workbench.core.layout.sharding import Sharding
from workbench.core.propagate.explain import report
from workbench.core.units import format_bytes
from workbench.viz import style

LABEL_LINES = 2  # distinct shardings written on an edge carrying several values
TOOLTIP_LINES = 12  # values listed in a tooltip
GREY = "#7F7F7F"
BOX_CHARS = 30  # a box's lines wrap past this many characters when folding by blocks


def _esc(text: str) -> str:
    """Plain text as a DOT string: backslashes kept, newlines as line breaks, never HTML."""
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return " " + text if text.startswith("<") else text


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _short(op: Op) -> str:
    """``layer0/mlp/dot_general.1`` -> ``dot_general.1`` (with the primitive if the name hides it)."""
    short = op.name.rsplit("/", 1)[-1]
    return short if op.primitive in short else f"{short}\n{op.primitive}"


def _pack(parts: list[str], sep: str, width: int) -> str:
    """``parts`` joined by ``sep``, onto a new line wherever one would pass ``width``."""
    lines = [parts[0]]
    for part in parts[1:]:
        if len(lines[-1]) + len(sep) + len(part) > width:
            lines[-1] += sep.rstrip()
            lines.append(part)
        else:
            lines[-1] += sep + part
    return "\n".join(lines)


def text_width(text: str, size: float = 10) -> float:
    """About how wide ``text`` is in Helvetica at ``size`` points (its longest line)."""
    narrow, wide = set("fijlrtI.,:;/|!'()[] "), set("mwMW@%")

    def em(c: str) -> float:
        return 0.3 if c in narrow else 0.85 if c in wide else 0.68 if c.isupper() else 0.56

    return size * max(sum(map(em, line)) for line in text.split("\n"))


def _snug(kind: str, label: str, double: bool) -> dict[str, str]:
    """A parallelogram (input) or ellipse (output) sized to its label (``fixedsize=shape``:
    the label still counts against overlaps), with a gentler slant than dot's."""
    w = text_width(label)
    if kind == "in":
        w, extra = w + 26, dict(shape="polygon", sides="4", skew="0.3")
    else:
        w, extra = 1.15 * w + 14, {}
    w += 8 * double
    return dict(extra, fixedsize="shape", width=f"{w / 72:.2f}", height="0.36" if double else "0.3")


LOOPED, NO_STAGE = -1, -2  # an op every stage runs on its iterations; one on no stage


def _stage_span(stages: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``stages 0–2, 5``; ``[3]`` -> ``stage 3``."""
    runs: list[list[int]] = []
    for k in stages:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    text = ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)
    return f"stage{'s' * (len(stages) > 1)} {text}"


class StageMarks:
    """What a pipelined state's stage cuts say of each op and value, read from core's
    ``Stage`` and ``Boundary`` records (``anatomy.stages``); nothing is decided here."""

    def __init__(self, pipeline):
        cuts = self.cuts = pipeline.cuts
        self.pipeline, S = pipeline, pipeline.stages
        self.stage = {  # a model chunk's ops on the stage running it (virtual stage g: g % S)
            o: s.index % S for s in cuts.stages for o in (*s.forward, *s.backward, *s.optimizer)
        }
        self.stage.update(dict.fromkeys(cuts.looped, LOOPED))
        self.why = dict(cuts.unplaced)
        self.sends: dict[int, list[int]] = {}  # value -> the boundaries it crosses
        for b in cuts.boundaries:
            for v in b.values:
                self.sends.setdefault(v, []).append(b.after)

    def of(self, ops: list[int]) -> frozenset[int]:
        """The stages (``LOOPED``, ``NO_STAGE``) of ``ops``."""
        return frozenset(self.stage.get(o, NO_STAGE) for o in ops)

    def describe(self, ops: list[int]) -> tuple[str, str, str | None]:
        """A label line, a tooltip and a fill (one stage only) for a node drawing ``ops``."""
        count = Counter(self.stage.get(o, NO_STAGE) for o in ops)
        stages = sorted(k for k in count if k >= 0)
        looped, lost = count[LOOPED], count[NO_STAGE]
        parts = [_stage_span(stages)] if stages else []
        if looped:
            parts.append(f"{looped} on every stage" if parts else "every stage")
        if lost:
            parts.append(f"{lost} on no stage" if parts else "no stage")
        whys = dict.fromkeys(self.why.get(o, "not in the stage cuts") for o in ops
                             if self.stage.get(o, NO_STAGE) == NO_STAGE)  # fmt: skip
        p = self.pipeline
        if len(ops) == 1:
            k = stages[0] if stages else None
            tip = (
                f"stage {k} of {p.stages} (pipeline over {p.axis!r})"
                if k is not None
                else "every stage: a loop each stage runs on its own range of iterations"
                if looped
                else f"no stage: {next(iter(whys))}"
            )
        else:
            tip = [f"stage {k}: {_plural(count[k], 'op')}" for k in stages]
            if looped:
                tip.append(
                    f"every stage (a loop, on each stage's iterations): {_plural(looped, 'op')}"
                )
            if lost:
                tip.append(f"no stage: {_plural(lost, 'op')} ({'; '.join(list(whys)[:3])})")
            tip = "\n".join(tip)
        fill = style.stage_fill(stages[0]) if len(stages) == 1 and not looped + lost else None
        return " · ".join(parts), tip, fill

    def send(self, vids: list[int], src: frozenset | None, dst: frozenset | None) -> str:
        """``send stage 0 → 1`` for an edge carrying values a stage sends to the next, unless
        both its ends sit on one and the same stage; else ``""``."""
        if src is not None and src == dst and len(src) == 1 and min(src) >= 0:
            return ""
        afters = sorted({a for v in vids for a in self.sends.get(v, ())})
        if not afters:
            return ""
        S = self.pipeline.stages
        if len(afters) > 2 and afters[-1] - afters[0] == len(afters) - 1:  # a loop's carry
            return f"send stage {afters[0]} → {afters[0] + 1} … {afters[-1]} → {afters[-1] + 1}"
        return "send stage " + ", ".join(f"{a % S} → {(a + 1) % S}" for a in afters)

    def legend(self) -> list[str]:
        """The legend's cells: the pipeline, then one per stage in its fill."""
        p = self.pipeline
        head = f"pipeline over {p.axis}: {p.schedule.kind}, S={p.stages}, M={p.microbatches}"
        head += f", v={p.schedule.virtual_stages}" if p.schedule.virtual_stages > 1 else ""
        cells = [f"<td>{_html(head)}</td>"]
        cells += [f'<td bgcolor="{style.stage_fill(k)}">stage {k}</td>' for k in range(p.stages)]
        unfilled = ["every stage (a loop)"] * bool(self.cuts.looped)
        unfilled += ["no stage"] * bool(self.cuts.unplaced)
        if unfilled:
            cells.append(f"<td>no fill: {' or '.join(unfilled)}</td>")
        return cells


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Attributes:
    """Attribute builders over the drawing's data (``p``, ``state``, ``mesh``, ``sh``, ...)."""

    # -- attributes ---------------------------------------------------------------------------
    @staticmethod
    def _attrs(label: str, tooltip: str, **attrs: str) -> dict[str, str]:
        return dict(label=_esc(label), tooltip=_esc(tooltip or label), **attrs)

    def _values_text(self, vids: Iterable[int], shardings: dict | None = None) -> str:
        vids = list(vids)
        lines = []
        for v in vids[:TOOLTIP_LINES]:
            s = self.sh[v] if shardings is None else shardings[v]
            lines.append(f"{self.p.values[v].name}: {s}")
            lines += self._why(v, s)
        if len(vids) > TOOLTIP_LINES:
            lines.append(f"... and {len(vids) - TOOLTIP_LINES} more")
        return "\n".join(lines)

    def _why(self, v: int, s: Sharding) -> list[str]:
        lines = []
        for axis in (*s.tiled_axes, *s.partial_axes):
            p = self.state.provenance.get((v, axis))
            if p is None:
                continue
            sched = self.state.schedule
            tactic = sched[p.tactic] if p.tactic < len(sched) else f"tactic #{p.tactic}"
            via = "selected" if p.op is None else f"via {self.p.ops[p.op].name}"
            lines.append(f"  {axis}: {tactic}, {via}")
        return lines

    def _conflict_text(self, node: str) -> tuple[str, str]:
        found = self.conflicts.get(node, [])
        axes = ",".join(dict.fromkeys(c.axis for c in found))
        reports = "\n".join(str(report(self.p, self.state, c)) for c in found[:5])
        return axes, reports

    def _op_attrs(self, op: Op, shape: str = "box") -> dict[str, str]:
        label = _short(op)
        code = where(op.source, op.library, full=True)
        tip = [f"{op.name} ({op.primitive})", code, self._values_text(op.results)]
        attrs = dict(shape=shape, style="rounded", **{"class": "wb-op"})
        axes, reports = self._conflict_text(f"op{op.id}")
        if reports:
            label += f"\nconflict on {axes}"
            tip.append(reports)
            attrs.update(
                color=style.CONFLICT,
                penwidth="3",
                style="rounded,filled,bold",
                fillcolor=style.CONFLICT_FILL,
            )
        elif any(r in self.changed for r in op.results):
            attrs.update(penwidth="2.5", style="rounded,bold")
        if self.stages is not None:
            line, why, fill = self.stages.describe([op.id])
            label += f"\n{line}"
            tip.insert(1, why)
            if fill and not reports:
                attrs.update(style=attrs["style"] + ",filled", fillcolor=fill)
        return self._attrs(label, "\n".join(t for t in tip if t), **attrs)

    def _crossing(self, vids: set[int]) -> str:
        """``3 batch, 1 batch{sum: model}, 2 replicated``: the layouts of values crossing a box."""
        kinds = Counter()
        for v in vids:
            tiled, partial = style.axes_of((self.sh[v],), self.mesh)
            kinds[(",".join(tiled) or "replicated") + style.reductions_text(partial)] += 1
        ranked = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
        parts = [f"{n} {kind}" for kind, n in ranked[:3]] + ["…"] * (len(kinds) > 3)
        return _pack(parts, ", ", BOX_CHARS) if self.blocks else ", ".join(parts)

    def _group_attrs(self, group) -> dict[str, str]:
        ops = self.p.ops
        if len(group.roots) == 1 and not group.key:
            head = f"{ops[group.roots[0]].name} ({ops[group.roots[0]].primitive})"
        else:
            head = "/".join(group.scope) or "(top level)"
        counts = [_plural(len(group.ops), "op")]
        if self.inside[group.node]:
            counts.append(_plural(self.inside[group.node], "collective"))
        n_changed = sum(r in self.changed for o in group.ops for r in ops[o].results)
        if n_changed:
            counts.append(f"{n_changed} changed")
        axes, reports = self._conflict_text(group.node)
        if reports:
            counts.append(f"conflict on {axes}")
        framed = group.key.startswith(f"{group.phase}/")  # in its phase's frame, which says it
        title = head if head == group.phase or framed else f"{head} · {group.phase}"
        lines = [title, _pack(counts, " · ", BOX_CHARS) if self.blocks else " · ".join(counts)]
        if self.cross_in[group.node]:
            lines.append("in: " + self._crossing(self.cross_in[group.node]))
        if self.cross_out[group.node]:
            lines.append("out: " + self._crossing(self.cross_out[group.node]))
        prims = Counter(ops[o].primitive for o in group.ops).most_common(10)
        tip = ", ".join(f"{p} ×{n}" for p, n in prims) + ("\n" + reports if reports else "")
        attrs = dict(shape="box3d", style="filled", fillcolor="#F4F4F4", **{"class": "wb-box"})
        if group.key:
            lines[0] += "  ▾"
        if reports:
            attrs.update(color=style.CONFLICT, penwidth="3", fillcolor=style.CONFLICT_FILL)
        elif n_changed:
            attrs.update(penwidth="2.5", style="filled,bold")
        if self.stages is not None:
            line, why, fill = self.stages.describe(group.ops)
            lines.insert(1, line)
            tip = f"{why}\n{tip}"
            if fill and not reports:
                attrs["fillcolor"] = fill
        return self._attrs("\n".join(lines), f"{head}\n{tip}", **attrs)

    def _io_attrs(self, kind: str, prefix: str, members: list) -> dict[str, str]:
        shape = "parallelogram" if kind == "in" else "ellipse"
        vids = [k if kind == "in" else self.p.outputs[k] for k, _ in members]
        bold = any(v in self.changed for v in vids)
        attrs = dict(
            shape=shape,
            style="bold" if bold else "solid",
            penwidth="2.5" if bold else "1",
            **{"class": "wb-io"},
        )
        label = members[0][1] if len(members) == 1 else f"{prefix} ×{len(members)}"
        if len(members) > 1:
            attrs["peripheries"] = "2"
        if self.blocks:  # as narrow as the label: dot draws these shapes twice its width
            attrs.update(_snug(kind, label, len(members) > 1))
        tip = f"{label}\n{self._values_text(vids)}" if len(members) > 1 else self._values_text(vids)
        return self._attrs(label, tip, **attrs)

    def _collective_attrs(self, cs: list[Collective]) -> dict[str, str]:
        total: dict[tuple, list[int]] = {}
        for c in cs:
            t = total.setdefault((c.kind, c.axes), [0, 0])
            t[0] += c.count
            t[1] += c.bytes * c.count
        lines = []
        for (kind, axes), (n, nbytes) in list(total.items())[:3]:
            times = f" ×{n}" if n > 1 else ""
            lines.append(f"{kind} · {','.join(axes)}\n{format_bytes(nbytes)}{times}")
        if len(total) > 3:
            lines.append(f"+{len(total) - 3} more")
        why = [c.why or f"{c.kind} of {self.p.values[c.value].name}" for c in cs[:TOOLTIP_LINES]]
        code = dict.fromkeys(where(c.source, c.library, full=True) for c in cs[:TOOLTIP_LINES])
        why += [f"code: {line}" for text in code if text for line in text.split("\n")][:6]
        first = cs[0].axes[0] if cs[0].axes else None
        return self._attrs(
            "\n".join(lines),
            "\n".join(why),
            shape="box",
            style="rounded,filled",
            fillcolor="#FFF5CC",
            color=self.colors.get(first, GREY),
            penwidth="2",
            fontsize="8",
            **{"class": "wb-collective"},
        )

    def _edge_attrs(self, items: list[tuple[int, Sharding]]) -> dict[str, str]:
        shardings = [s for _, s in items]
        tiled, partial = style.axes_of(shardings, self.mesh)
        pending = {a for a, _ in partial}
        axes = [*tiled, *(a for a in self.mesh.names if a in pending and a not in tiled)]
        counts = Counter(str(s) for s in shardings).most_common()
        lines = [text + (f" ×{n}" if n > 1 else "") for text, n in counts[:LABEL_LINES]]
        if len(counts) > LABEL_LINES:
            lines.append(f"+{len(counts) - LABEL_LINES} more")
        changed = any(v in self.changed for v, _ in items)
        styles = ["dashed"] * bool(partial) + ["bold"] * changed
        return self._attrs(
            "\n".join(lines),
            self._values_text([v for v, _ in items], dict(items)),
            color=":".join(self.colors[a] for a in axes) or style.REPLICATED,
            fontcolor=self.colors[axes[0]] if axes else GREY,
            style=",".join(styles) or "solid",
            penwidth="3" if changed else "1.2",
            **{"class": "wb-value"},
        )

    def _mark_send(self, attrs: dict[str, str], vids: list[int], src: str, dst: str) -> None:
        """An edge carrying values a pipeline stage sends to the next says so (first line)."""
        if self.stages is None:
            return
        text = self.stages.send(vids, self._node_stages(src), self._node_stages(dst))
        if text:
            axis = self.stages.pipeline.axis
            attrs["label"] = _esc(text) + ("\\n" + attrs["label"] if attrs["label"] else "")
            attrs["tooltip"] = _esc(f"{text}: point-to-point over {axis!r}\n") + attrs["tooltip"]
            attrs["class"] += " wb-send"

    def _legend(self, vertical: bool = False) -> dict[str, str]:
        cells = [
            f'<td><font color="{c}">━━ {a} ({self.mesh.axis_size(a)})</font></td>'
            for a, c in self.colors.items()
        ]
        cells.append(f'<td><font color="{style.REPLICATED}">━━ replicated</font></td>')
        cells.append("<td>╌╌ pending sum</td>")
        staged = self.stages.legend() if self.stages is not None else []
        if vertical:  # a column: narrow beside the folded program's inputs
            rows = "".join(
                "<tr>" + c.replace("<td", '<td align="left"', 1) + "</tr>" for c in cells + staged
            )
        else:
            rows = f"<tr>{''.join(cells)}</tr>"
            if staged:  # the pipeline's stages: a row of their own
                rows += f'<tr><td colspan="{len(cells)}"><table border="0" cellspacing="2"><tr>'
                rows += f"{''.join(staged)}</tr></table></td></tr>"
        return dict(label=f'<<table border="0" cellspacing="2">{rows}</table>>', shape="plaintext")
