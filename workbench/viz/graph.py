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
- A pipelined state (``PP``): each node says its stage as core's stage cuts give it (a
  box: the stages it spans; ``every stage`` for a loop each stage runs on its iterations;
  ``no stage``, with why), filled in the stage's colour when on one; edges carrying values
  a stage sends to the next say ``send stage 0 → 1``; the legend names the pipeline.

The graph is built in one pass over the ops; every lookup is a dict or list index.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import graphviz

from workbench.core.gcpause import without_gc
from workbench.core.ir.program import Op, Program
from workbench.core.layout.collectives import Collective
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.state import State
from workbench.core.strategies.pipeline import pipeline_of
from workbench.viz import style
from workbench.viz.blocks import assign_blocks, io_groups, reading_order
from workbench.viz.collapse import MAX_NODES, PHASES, Nodes, assign_nodes
from workbench.viz.graph_attrs import GREY, Attributes, StageMarks

FONT = "Helvetica"
IO_BUDGET = 32  # inputs (outputs) drawn one by one; past this many they group by name prefix
IO_FANOUT = 8  # boxes an input (output) group is linked to when folding by blocks


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
    return graph_picture(
        program,
        state,
        mesh,
        collectives=collectives,
        changed=changed,
        collapse=collapse,
        expand=expand,
        phases=phases,
        max_nodes=max_nodes,
        legend=legend,
    ).digraph


@dataclass(frozen=True, slots=True)
class Picture:
    """A drawing and where things are in it: SVG element ids (the DOT node names, ``e<n>``
    for edges, ``b<n>`` for the clusters of opened blocks) per op and value, the key each
    box or cluster opens or folds, and the elements the last tactic changed."""

    digraph: graphviz.Digraph
    nodes: Nodes
    op_element: dict[int, str]  # op id -> the node it is drawn as (its own or a box)
    value_elements: dict[int, tuple[str, ...]]  # value id -> the edges carrying it
    folds: dict[str, str]  # element id -> the key it opens (a box) or folds (a cluster)
    changed: tuple[str, ...]  # elements drawn bold: what the last tactic changed
    collectives: dict[str, tuple[Collective, ...]]  # collective node -> the collectives in it
    node_values: dict[str, tuple[int, ...]]  # an op's node -> its results; an input's or output's

    def element_value(self, element: str) -> int | None:
        """The value a click on ``element`` means: an edge's first, an op's first result."""
        for v, ids in self.value_elements.items():
            if element in ids:
                return v
        found = self.node_values.get(element, ())
        return found[0] if found else None


@without_gc
def graph_picture(
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
    layers: dict[int, int] | None = None,
) -> Picture:
    """``program_graph``'s drawing with its `Picture` index. ``collapse="blocks"`` folds by
    the anatomy's phases and repeated blocks (see ``blocks.py``); ``expand`` then holds the
    keys of what is open (default: the forward phase) and ``layers`` may hand in
    ``blocks.op_layers(program)``, kept by the caller."""
    if collapse == "blocks":
        expand = expand or ("forward",)
        nodes = assign_blocks(program, phases=phases, expand=expand, layers=layers)
    else:
        nodes = assign_nodes(
            program, phases=phases, collapse=collapse, expand=expand, max_nodes=max_nodes
        )
    drawing = _Drawing(program, state, mesh, nodes, changed, blocks=collapse == "blocks")
    return drawing.draw(collectives, legend)


def to_svg(digraph: graphviz.Digraph) -> str:
    """Render with graphviz ``dot`` to an SVG string (tooltips become hover titles)."""
    return digraph.pipe(format="svg", encoding="utf-8")


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
            g.node(name, **{"id": name, **attrs})
        for name, box in self.boxes.items():
            with g.subgraph(name=name) as sub:
                sub.attr(**box.attrs)
                box.emit(sub)


def _bold_nodes(box: _Box) -> list[str]:
    found = [name for name, attrs in box.nodes if "bold" in attrs.get("style", "")]
    for sub in box.boxes.values():
        found += _bold_nodes(sub)
    return found


class _Drawing(Attributes):
    """The data of one ``program_graph`` call; it lives only for that call."""

    def __init__(self, program, state, mesh, nodes: Nodes, changed, blocks: bool = False):
        self.p, self.state, self.mesh, self.n = program, state, mesh, nodes
        self.sh = state.shardings
        self.colors = style.axis_colors(mesh)
        self.changed = frozenset(state.changed if changed is None else changed)
        self.blocks = blocks
        self.io: dict[str, tuple[str, str, list]] = {}  # node -> (kind, title, members)
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
        self.folds: dict[str, str] = {g.node: g.key for g in nodes.groups.values() if g.key}
        self.bold: list[str] = []
        self.collective_at: dict[str, tuple[Collective, ...]] = {}
        self.phase_boxes = {g.node for g in nodes.groups.values() if g.key in PHASES}
        pipeline = pipeline_of(program, mesh, state)
        self.stages = None if pipeline is None else StageMarks(pipeline)
        self.stage_sets: dict[str, frozenset[int] | None] = {}  # node -> its ops' stages

    def _node_stages(self, node: str) -> frozenset[int] | None:
        """The stages of the ops a node draws (None: an input, output or collective)."""
        if node not in self.stage_sets:
            op = node.removeprefix("end").removeprefix("op")
            group = self.n.groups.get(node)
            ops = group.ops if group else [int(op)] if op.isdigit() else None
            self.stage_sets[node] = None if ops is None else self.stages.of(ops)
        return self.stage_sets[node]

    # -- which node a value leaves and enters -------------------------------------------------
    def _io_nodes(self, items: list[tuple[int, str]], kind: str) -> dict[int, str]:
        """Inputs (outputs) by node: one by one, by role when folding by blocks (see
        ``blocks.io_groups``), else by name prefix past ``IO_BUDGET``."""
        keys = {k: name for k, name in items}
        if self.blocks:
            titles = io_groups(self.p, self.n, list(keys), kind, IO_BUDGET)
            keys = {k: name if t is None else t for (k, name), t in zip(items, titles)}
        elif len(items) > IO_BUDGET:
            keys = {k: f"{p}/…" for k, p in _name_prefixes(keys, IO_BUDGET).items()}
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
            elif self._to_folded_phase(src, dst):  # counted in the phase's box
                self.inside[dst if dst in self.phase_boxes else src] += 1
            elif dst is not None and src != dst:  # from no node: a constant, a phase not drawn
                self.routes.setdefault((src, dst), []).append(c)

    def _add(self, src: str | None, dst: str | None, v: int) -> None:
        if src == dst:
            return
        if dst in self.cross_in:
            self.cross_in[dst].add(v)
        if src in self.cross_out:
            self.cross_out[src].add(v)
        if src is not None and dst is not None and not self._to_folded_phase(src, dst):
            self.edges.setdefault((src, dst), {})[v] = None

    def _to_folded_phase(self, src: str | None, dst: str | None) -> bool:
        """An edge between a folded phase and anything but an input or output: left out (the
        box counts what crosses it), since the saved activations running to the backward
        box from every layer cost ``dot`` seconds (15 s at 80 layers)."""

        def io(node: str | None) -> bool:
            return node is None or node.startswith(("in", "out"))

        return (src in self.phase_boxes and not io(dst)) or (
            dst in self.phase_boxes and not io(src)
        )

    def _thin_fans(self) -> None:
        """Edges between an input or output group and more than ``IO_FANOUT`` boxes: left
        out (the boxes count them). One group of 800 weights feeding 80 layer boxes is 80
        edges across 80 ranks, which cost ``dot`` 20 s."""
        fans: dict[str, list[tuple[str, str]]] = {}
        for src, dst in self.edges:
            for io, other in ((src, dst), (dst, src)):
                if io in self.io and other in self.n.groups:
                    fans.setdefault(io, []).append((src, dst))
        for pairs in fans.values():
            if len(pairs) > IO_FANOUT:
                for pair in pairs:
                    del self.edges[pair]

    # -- the picture --------------------------------------------------------------------------
    def draw(self, collectives: Iterable[Collective], legend: bool) -> Picture:
        self._collect(collectives)
        if self.phase_boxes:  # folding by blocks
            self._thin_fans()
        g = graphviz.Digraph(
            self.p.name,
            graph_attr=dict(
                rankdir="TB",
                newrank="true",  # ranks clusters robustly (dot 2.43 can fail without it)
                ranksep="0.35",
                nodesep="0.15" if self.blocks else "0.25",
                fontname=FONT,
                fontsize="10",
            ),
            node_attr=dict(fontname=FONT, fontsize="10", height="0.3", margin="0.08,0.04"),
            edge_attr=dict(fontname=FONT, fontsize="8", arrowsize="0.6"),
        )
        root = _Box()
        self.order = reading_order(self.p, self.n) if self.blocks else []
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
            self.collective_at[f"c{i}"] = tuple(cs)
            self.phase_of[f"c{i}"] = self.phase_of.get(dst)
            if src is not None:
                edges.append((src, f"c{i}", [(v, self.sh[v]) for v in moved]))
            after = {c.value: c.dst for c in sorted(cs, key=lambda c: c.step or 0)}
            edges.append((f"c{i}", dst, list(after.items())))
        edges += [(s, d, [(v, self.sh[v]) for v in vs]) for (s, d), vs in self.edges.items() if vs]
        if legend:
            root.nodes.append(("legend", self._legend(vertical=self.blocks)))
        root.emit(g)
        if self.blocks:  # before the edges: dot keeps their direction where edges loop
            for src, dst in self.order:
                g.edge(src, dst, style="invis", weight="4")
        self.bold += _bold_nodes(root)
        value_elements: dict[int, list[str]] = {}
        for n, (src, dst, items) in enumerate(edges):
            attrs = self._edge_attrs(items)
            self._mark_send(attrs, [v for v, _ in items], src, dst)
            if self.blocks and any(len(self.io.get(x, ((),) * 3)[2]) > 1 for x in (src, dst)):
                attrs["label"] = ""  # a group's many values: its tooltip lists them
            self._edge(g, src, dst, dict(attrs, id=f"e{n}"))
            for v, _ in items:
                value_elements.setdefault(v, []).append(f"e{n}")
            if "bold" in attrs["style"]:
                self.bold.append(f"e{n}")
        op_element = {o: node for o, node in enumerate(self.n.node_of) if node is not None}
        return Picture(
            g,
            self.n,
            op_element,
            {v: tuple(ids) for v, ids in value_elements.items()},
            self.folds,
            tuple(self.bold),
            self.collective_at,
            self._node_values(),
        )

    def _node_values(self) -> dict[str, tuple[int, ...]]:
        found = {f"op{o}": self.p.ops[o].results for o in self.n.drawn}
        for node, (kind, _, members) in self.io.items():
            found[node] = tuple(k if kind == "in" else self.p.outputs[k] for k, _ in members)
        return found

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
        folded = {g.phase for g in self.n.groups.values() if g.key == g.phase}
        phase_box = {  # a frame per phase, but for a folded one: its box says it
            ph: root.box(
                f"cluster_phase_{ph}", label=ph, style="dashed", color=GREY, fontcolor=GREY
            )
            if len(phases) > 1 and ph not in folded
            else root
            for ph in phases
        }
        first = dict.fromkeys(n for pair in self.order for n in pair)  # dot reads in this order
        rank = {n: i for i, n in enumerate(first)}
        for node, group in sorted(self.n.groups.items(), key=lambda ng: rank.get(ng[0], len(rank))):
            phase_box[group.phase].nodes.append((node, self._group_attrs(group)))
            self.phase_of[node] = group.phase
        scope_ids: dict[tuple, int] = {}
        clusters: dict[str, str] = {}  # an opened block's key -> its cluster's id
        region_box: dict[tuple[int, int], _Box] = {}
        for oid in self.n.drawn:
            op = ops[oid]
            phase = self.phase_of[f"op{oid}"] = ops[self.n.root[oid]].phase
            if op.parent is None:
                box = phase_box[phase]
                if oid in self.n.cluster_of:  # an opened block: a cluster that folds it
                    key, title = self.n.cluster_of[oid]
                    if key not in clusters:
                        clusters[key] = f"b{len(clusters)}"
                        self.folds[clusters[key]] = key
                    name = clusters[key]
                    box = box.box(
                        f"cluster_{name}", id=name, label=f"{title} ▴", color=GREY, penwidth="2"
                    )
                for i in range(1, len(op.scope) + 1):
                    if op.scope[:i] == (phase,):  # the optimizer's scope: its phase box says it
                        continue
                    block = self.n.cluster_of.get(oid, ("",))[0]
                    sid = scope_ids.setdefault((phase, block, op.scope[:i]), len(scope_ids))
                    box = box.box(
                        f"cluster_s{sid}",
                        id=f"s{sid}",
                        label=op.scope[i - 1],
                        color=GREY,
                        penwidth="1",
                    )
            else:
                box = region_box[(op.parent, self.n.region_index[oid])]
            if not op.regions:
                box.nodes.append((f"op{oid}", self._op_attrs(op)))
                continue
            rbox = box.box(
                f"cluster_r{oid}", id=f"r{oid}", style="rounded", color=GREY, penwidth="1"
            )
            self.phase_of[f"end{oid}"] = phase
            rbox.nodes.append((f"op{oid}", self._op_attrs(op, shape="house")))
            end = self._attrs(f"end {op.name.rsplit('/', 1)[-1]}", op.name, shape="invhouse")
            rbox.nodes.append((f"end{oid}", end))
            for k, region in enumerate(op.regions):
                multi = len(op.regions) > 1
                region_box[(oid, k)] = (
                    rbox.box(
                        f"cluster_r{oid}_{k}", id=f"r{oid}_{k}", label=region.name, style="dotted"
                    )
                    if multi
                    else rbox
                )
