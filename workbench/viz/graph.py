"""The program graph: ops as nodes, values as edges labelled and coloured by their sharding.

``program_graph(program, state, mesh)`` returns a ``graphviz.Digraph``; ``to_svg`` renders it.

- An edge carries one or more values from the node producing them to the node using
  them, labelled with their global shape and sharding (``f32[256@batch,1024@model]``) and
  coloured by the mesh axes they are tiled on (several axes: parallel strokes, as in
  ``color="#0072B2:#E69F00"``); pending reductions are dashed and labelled
  ``{sum: model}``; replicated values are grey; values the last tactic changed are bold.
- Inputs are parallelograms and outputs ovals, named by value name.
- A collective of the plan sits on the edge from its value's producer to the op needing
  it, as a small node saying kind, axes and bytes.
- An op where propagation stopped on a conflict has a red border; its tooltip says why.
- Big programs collapse by name scope and phase (see ``collapse.py``); loops and branches
  drawn op by op are clusters holding their bodies, entered at the op's node and left at
  its ``end`` node.

The graph is built in one pass over the ops; every lookup is a dict or list index.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import graphviz

from workbench.core.collectives import Collective
from workbench.core.explain import report
from workbench.core.ir.program import Op, Program
from workbench.core.mesh import Mesh
from workbench.core.sharding import Sharding
from workbench.core.state import State
from workbench.core.units import format_bytes
from workbench.viz import style
from workbench.viz.collapse import MAX_NODES, PHASES, Nodes, assign_nodes

FONT = "Helvetica"
IO_BUDGET = 32  # inputs (outputs) drawn one by one; past this many they group by name prefix
LABEL_LINES = 2  # distinct shardings written on an edge carrying several values
TOOLTIP_LINES = 12  # values listed in a tooltip
GREY = "#7F7F7F"


def program_graph(
    program: Program,
    state: State,
    mesh: Mesh,
    *,
    collectives: Iterable[Collective] = (),
    changed: Iterable[int] | None = None,
    collapse: int | str | None = "auto",
    expand: Iterable[str | Sequence[str]] = (),
    phases: Iterable[str] = PHASES,
    max_nodes: int = MAX_NODES,
    legend: bool = True,
) -> graphviz.Digraph:
    """Draw ``program`` with the shardings of ``state`` on ``mesh``.

    ``collectives``: the plan's collectives to draw (e.g. ``session.collectives()``).
    ``changed``: value ids to highlight (default: ``state.changed``, the last tactic's).
    ``collapse``: ``"auto"`` (the deepest scope depth that keeps under ``max_nodes``
    nodes), ``None`` (every op) or a depth (0: one box per phase, 1: per top-level scope).
    ``expand``: scope prefixes (``"layer3/attn"``) drawn op by op at any depth.
    ``phases``: which of forward, backward and optimizer to draw; edges to the others are
    left out (a box still counts the values crossing its boundary).
    """
    nodes = assign_nodes(
        program, phases=phases, collapse=collapse, expand=expand, max_nodes=max_nodes
    )
    return _Drawing(program, state, mesh, nodes, changed).draw(collectives, legend)


def to_svg(digraph: graphviz.Digraph) -> str:
    """Render with graphviz ``dot`` to an SVG string (tooltips become hover titles)."""
    return digraph.pipe(format="svg", encoding="utf-8")


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


def _name_prefixes(names: dict, budget: int) -> dict:
    """Key -> the longest name prefix (in ``/`` components) that keeps at most ``budget`` groups."""
    parts = {k: n.split("/") for k, n in names.items()}
    keys = {k: p[0] for k, p in parts.items()}
    for depth in range(max(map(len, parts.values())) - 1, 1, -1):
        deeper = {k: "/".join(p[:depth]) for k, p in parts.items()}
        if len(set(deeper.values())) <= budget:
            return deeper
    return keys


class _Box:
    """A (sub)graph being assembled: its nodes, then its clusters."""

    __slots__ = ("attrs", "boxes", "nodes")

    def __init__(self, **attrs: str):
        self.attrs, self.nodes, self.boxes = attrs, [], {}

    def box(self, name: str, **attrs: str) -> _Box:
        if name not in self.boxes:
            self.boxes[name] = _Box(**attrs)
        return self.boxes[name]

    def emit(self, g: graphviz.Digraph) -> None:
        for name, attrs in self.nodes:
            g.node(name, **attrs)
        for name, box in self.boxes.items():
            with g.subgraph(name=name) as sub:
                sub.attr(**box.attrs)
                box.emit(sub)


class _Drawing:
    """The data of one ``program_graph`` call; it lives only for that call."""

    def __init__(self, program, state, mesh, nodes: Nodes, changed):
        self.p, self.state, self.mesh, self.n = program, state, mesh, nodes
        self.sh = state.shardings
        self.colors = style.axis_colors(mesh)
        self.changed = frozenset(state.changed if changed is None else changed)
        self.io: dict[str, tuple[str, str, list]] = {}  # node -> (kind, name prefix, members)
        self.input_node = self._io_nodes(
            [(v, program.values[v].name) for v in program.inputs], "in"
        )
        outs = [
            (i, name)
            for i, (v, name) in enumerate(zip(program.outputs, program.output_names))
            if isinstance(v, int)
        ]
        self.output_node = self._io_nodes(outs, "out")
        self.output_of_value: dict[int, str] = {}
        for i, _ in reversed(outs):
            self.output_of_value[program.outputs[i]] = self.output_node[i]
        self.edges: dict[tuple[str, str], dict[int, None]] = {}
        self.routes: dict[tuple[str | None, str], list[Collective]] = {}
        self.cross_in: dict[str, set[int]] = {g: set() for g in nodes.groups}
        self.cross_out: dict[str, set[int]] = {g: set() for g in nodes.groups}
        self.inside: Counter[str] = Counter()  # collectives inside a collapsed box
        self.phase_of: dict[str, str | None] = {}  # node -> the phase it belongs to
        self.conflicts: dict[str, list] = {}
        for c in state.conflicts:
            self.conflicts.setdefault(nodes.node_of[c.op], []).append(c)

    # -- which node a value leaves and enters -------------------------------------------------
    def _io_nodes(self, items: list[tuple[int, str]], kind: str) -> dict[int, str]:
        keys = {k: name for k, name in items}
        if len(items) > IO_BUDGET:
            keys = _name_prefixes(keys, IO_BUDGET)
        members: dict[str, list] = {}
        for k, name in items:
            members.setdefault(keys[k], []).append((k, name))
        node_of = {}
        for j, (prefix, group) in enumerate(members.items()):
            self.io[f"{kind}{j}"] = (kind, prefix, group)
            node_of.update((k, f"{kind}{j}") for k, _ in group)
        return node_of

    def source(self, vid: int) -> str | None:
        """The node a value leaves: its producer's, or None (a constant, a phase not drawn)."""
        v = self.p.values[vid]
        if v.kind == "input":
            return self.input_node[vid]
        if v.producer is None:  # a captured constant
            return None
        node = self.n.node_of[v.producer]
        if (
            v.kind != "region_input"
            and self.p.ops[v.producer].regions
            and self.n.is_drawn(v.producer)
        ):
            return f"end{v.producer}"
        return node

    def target(self, op: Op, vid: int) -> str | None:
        """The node ``op`` reads ``vid`` at (None for a phase not drawn)."""
        if op.regions and self.n.is_drawn(op.id) and vid not in op.operands:
            return f"end{op.id}"  # a region's output, read when the body ends
        return self.n.node_of[op.id]

    # -- one pass over the ops ----------------------------------------------------------------
    def _collect(self, collectives: Iterable[Collective]) -> None:
        for op in self.p.ops:
            seen = set()
            for v in op.linked_operands:
                if isinstance(v, int) and v not in seen:
                    seen.add(v)
                    self._add(self.source(v), self.target(op, v), v)
        for i, v in enumerate(self.p.outputs):
            if i in self.output_node:
                self._add(self.source(v), self.output_node[i], v)
        for c in collectives:
            src = self.source(c.value)
            if c.op is None:
                dst = self.output_of_value.get(c.value)
            else:
                dst = self.target(self.p.ops[c.op], c.value)
            if src == dst and dst in self.n.groups:
                self.inside[dst] += 1
            elif dst is not None and src != dst:  # from no node: a constant, a phase not drawn
                self.routes.setdefault((src, dst), []).append(c)

    def _add(self, src: str | None, dst: str | None, v: int) -> None:
        if src == dst:
            return
        if dst in self.cross_in:
            self.cross_in[dst].add(v)
        if src in self.cross_out:
            self.cross_out[src].add(v)
        if src is not None and dst is not None:
            self.edges.setdefault((src, dst), {})[v] = None

    # -- the picture --------------------------------------------------------------------------
    def draw(self, collectives: Iterable[Collective], legend: bool) -> graphviz.Digraph:
        self._collect(collectives)
        g = graphviz.Digraph(
            self.p.name,
            graph_attr=dict(
                rankdir="TB",
                newrank="true",  # ranks clusters robustly (dot 2.43 can fail without it)
                ranksep="0.35",
                nodesep="0.25",
                fontname=FONT,
                fontsize="10",
            ),
            node_attr=dict(fontname=FONT, fontsize="10", height="0.3", margin="0.08,0.04"),
            edge_attr=dict(fontname=FONT, fontsize="8", arrowsize="0.6"),
        )
        root = _Box()
        self._place_ops(root)
        used = {n for pair in (*self.edges, *self.routes) for n in pair}
        for node, (kind, prefix, members) in self.io.items():
            if node in used:
                root.nodes.append((node, self._io_attrs(kind, prefix, members)))
        edges = []
        for i, ((src, dst), cs) in enumerate(self.routes.items()):
            carried = self.edges.get((src, dst), {})
            moved = dict.fromkeys(c.value for c in cs)
            for v in moved:
                carried.pop(v, None)
            root.nodes.append((f"c{i}", self._collective_attrs(cs)))
            self.phase_of[f"c{i}"] = self.phase_of.get(dst)
            if src is not None:
                edges.append((src, f"c{i}", [(v, self.sh[v]) for v in moved]))
            after = {c.value: c.dst for c in sorted(cs, key=lambda c: c.step or 0)}
            edges.append((f"c{i}", dst, list(after.items())))
        edges += [(s, d, [(v, self.sh[v]) for v in vs]) for (s, d), vs in self.edges.items() if vs]
        if legend:
            root.nodes.append(("legend", self._legend()))
        root.emit(g)
        for src, dst, items in edges:
            self._edge(g, src, dst, self._edge_attrs(items))
        return g

    def _edge(self, g, src: str, dst: str, attrs: dict[str, str]) -> None:
        if self.phase_of.get(src) == self.phase_of.get(dst) == "backward":
            # drawn upwards: each layer's backward sits beside its forward, and the values
            # saved for the backward pass cross over instead of running the whole height
            g.edge(dst, src, dir="back", **attrs)
            return
        g.edge(src, dst, **attrs)

    def _place_ops(self, root: _Box) -> None:
        ops = self.p.ops
        phases = {ops[self.n.root[o]].phase for o in self.n.drawn}
        phases |= {g.phase for g in self.n.groups.values()}
        phase_box = {
            ph: root.box(
                f"cluster_phase_{ph}", label=ph, style="dashed", color=GREY, fontcolor=GREY
            )
            if len(phases) > 1
            else root
            for ph in phases
        }
        for node, group in self.n.groups.items():
            phase_box[group.phase].nodes.append((node, self._group_attrs(group)))
            self.phase_of[node] = group.phase
        scope_ids: dict[tuple, int] = {}
        region_box: dict[tuple[int, int], _Box] = {}
        for oid in self.n.drawn:
            op = ops[oid]
            phase = self.phase_of[f"op{oid}"] = ops[self.n.root[oid]].phase
            if op.parent is None:
                box = phase_box[phase]
                for i in range(1, len(op.scope) + 1):
                    if op.scope[:i] == (phase,):  # the optimizer's scope: its phase box says it
                        continue
                    sid = scope_ids.setdefault((phase, op.scope[:i]), len(scope_ids))
                    box = box.box(f"cluster_s{sid}", label=op.scope[i - 1], color=GREY)
            else:
                box = region_box[(op.parent, self.n.region_index[oid])]
            if not op.regions:
                box.nodes.append((f"op{oid}", self._op_attrs(op)))
                continue
            rbox = box.box(f"cluster_r{oid}", style="rounded", color=GREY)
            self.phase_of[f"end{oid}"] = phase
            rbox.nodes.append((f"op{oid}", self._op_attrs(op, shape="house")))
            end = self._attrs(f"end {op.name.rsplit('/', 1)[-1]}", op.name, shape="invhouse")
            rbox.nodes.append((f"end{oid}", end))
            for k, region in enumerate(op.regions):
                multi = len(op.regions) > 1
                region_box[(oid, k)] = (
                    rbox.box(f"cluster_r{oid}_{k}", label=region.name, style="dotted")
                    if multi
                    else rbox
                )

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
        tip = [f"{op.name} ({op.primitive})", op.source, self._values_text(op.results)]
        attrs = dict(shape=shape, style="rounded")
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
        return self._attrs(label, "\n".join(t for t in tip if t), **attrs)

    def _crossing(self, vids: set[int]) -> str:
        """``3 batch, 1 batch{sum: model}, 2 replicated``: the layouts of values crossing a box."""
        kinds = Counter()
        for v in vids:
            tiled, partial = style.axes_of((self.sh[v],), self.mesh)
            kinds[(",".join(tiled) or "replicated") + style.reductions_text(partial)] += 1
        ranked = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
        parts = [f"{n} {kind}" for kind, n in ranked[:3]]
        return ", ".join(parts) + (", …" if len(kinds) > 3 else "")

    def _group_attrs(self, group) -> dict[str, str]:
        ops = self.p.ops
        if len(group.roots) == 1:
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
        title = head if head == group.phase else f"{head} · {group.phase}"
        lines = [title, " · ".join(counts)]
        if self.cross_in[group.node]:
            lines.append("in: " + self._crossing(self.cross_in[group.node]))
        if self.cross_out[group.node]:
            lines.append("out: " + self._crossing(self.cross_out[group.node]))
        prims = Counter(ops[o].primitive for o in group.ops).most_common(10)
        tip = ", ".join(f"{p} ×{n}" for p, n in prims) + ("\n" + reports if reports else "")
        attrs = dict(shape="box3d", style="filled", fillcolor="#F4F4F4")
        if reports:
            attrs.update(color=style.CONFLICT, penwidth="3", fillcolor=style.CONFLICT_FILL)
        elif n_changed:
            attrs.update(penwidth="2.5", style="filled,bold")
        return self._attrs("\n".join(lines), f"{head}\n{tip}", **attrs)

    def _io_attrs(self, kind: str, prefix: str, members: list) -> dict[str, str]:
        shape = "parallelogram" if kind == "in" else "ellipse"
        vids = [k if kind == "in" else self.p.outputs[k] for k, _ in members]
        bold = any(v in self.changed for v in vids)
        attrs = dict(
            shape=shape, style="bold" if bold else "solid", penwidth="2.5" if bold else "1"
        )
        if len(members) == 1 and members[0][1] == prefix:
            return self._attrs(prefix, self._values_text(vids), **attrs)
        noun = "inputs" if kind == "in" else "outputs"
        label = f"{prefix}/…\n{len(members)} {noun}"
        return self._attrs(label, self._values_text(vids), peripheries="2", **attrs)

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
        )

    def _legend(self) -> dict[str, str]:
        cells = [
            f'<td><font color="{c}">━━ {a} ({self.mesh.axis_size(a)})</font></td>'
            for a, c in self.colors.items()
        ]
        cells.append(f'<td><font color="{style.REPLICATED}">━━ replicated</font></td>')
        cells.append("<td>╌╌ pending sum</td>")
        row = "".join(cells)
        return dict(
            label=f'<<table border="0" cellspacing="2"><tr>{row}</tr></table>>', shape="plaintext"
        )
