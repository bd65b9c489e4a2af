"""Anatomy: what a training step is made of, read from its structure alone.

Nothing here looks at a value's, scope's or argument's name: names are only what a user
passes to correct a finding. From the dataflow, the phases (``phases``) and the dimension
classes (``dims``):

- *parameters*: inputs the forward or backward pass reads whose update the optimizer
  computes elementwise (the update's same-shaped chain holds exactly one such input); in
  a step with no update, the inputs whose gradients it returns in their place;
- their *gradients* (what the backward pass hands that chain), *optimizer state* (the
  other inputs in it: moments, a master copy; and inputs only the update reads, like a
  step counter) and *updates* (the outputs made in it);
- *data inputs* (the other inputs the forward pass reads, random keys aside) and their
  *batch* dimension: the dimension class every data input carries, no parameter does,
  and no op carries twice (the sequence, which attention carries twice, comes second);
- layers (``layers``): repeated blocks, projections, attention, MLP, embeddings.

Each finding says what it rests on (``evidence``) and how sure it is (``confidence``).
``Program.anatomy()`` builds it once per program.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

from workbench.core.anatomy.dims import DimClasses, dimension_classes
from workbench.core.anatomy.report import Finding, report
from workbench.core.anatomy.updates import tree_pairs, update_chains
from workbench.core.dtypes import is_extended
from workbench.core.gcpause import without_gc
from workbench.core.ops import traits as traits_of


def is_key(value) -> bool:
    """A typed random key (an extended dtype such as ``key<fry>``)."""
    return is_extended(value.dtype)


@dataclass(eq=False)
class Anatomy:
    """The roles of a program's values; see the module docstring."""

    program: object
    classes: DimClasses
    parameters: tuple[int, ...]
    state: dict[int, tuple[int, ...]]  # parameter -> optimizer-state inputs shaped like it
    gradients: dict[int, int]  # parameter -> its gradient
    updates: dict[int, tuple[int, ...]]  # parameter -> outputs computed in its update
    new_params: dict[int, int]  # parameter -> the output it is returned as
    optimizer_state: tuple[int, ...]  # every optimizer-state input
    keys: tuple[int, ...]  # random keys
    data: tuple[tuple[int, int | None], ...]  # data input, its batch dim (None: it has none)
    batch_class: int | None
    sequence_class: int | None
    findings: list[Finding] = field(default_factory=list)
    #: corrections a schedule made: ``(role, value ids, dim)`` (see ``corrected``)
    corrections: tuple = ()
    _embeddings: list | None = None
    _splits: dict = field(default_factory=dict)  # value -> ("heads" | "hidden", dim)

    @cached_property
    def layers(self):
        """Repeated blocks, projections, attention, MLP and embeddings (see ``layers``)."""
        from workbench.core.anatomy.layers import find_layers

        return find_layers(self)

    @property
    def experts(self):
        """One ``Experts`` per mixture-of-experts layer: router, expert parameters with their
        experts dim, dispatch and combine ops, form (see ``experts``)."""
        return self.layers.experts

    # -- what the named strategies act on ------------------------------------------------
    @property
    def embeddings(self) -> list[tuple[int, int]]:
        """``(table, vocabulary dim)`` per embedding table."""
        return self.layers.embeddings if self._embeddings is None else self._embeddings

    def heads_splits(self, only: str | None = None) -> list[tuple[int, int | None]]:
        """``(value, dim)`` Megatron splits for attention: each up projection's heads dim,
        or (fused projections) the queries, keys and values by heads after the split.
        ``only="queries"`` gives the queries alone."""
        layers, values = self.layers, self.program.values
        out = []
        for a in layers.attention:
            groups = (a.queries,) if only == "queries" else (a.queries, a.keys, a.values)
            for v in (x for g in groups for x in g):
                if v in self._splits:
                    continue
                if a.fused:
                    dims = self.classes.dims_of(v, len(values[v].shape))
                    out.append((v, dims.index(a.heads) if a.heads in dims else None))
                else:
                    out.append((v, layers.split_dim(self, v)))
        out += [(v, d) for v, (kind, d) in self._splits.items() if kind == "heads"]
        return out

    def hidden_splits(self) -> list[tuple[int, int | None]]:
        """``(parameter, dim)`` Megatron splits for MLP up (and gate) projections."""
        layers = self.layers
        in_attention = {v for a in layers.attention for v in (*a.queries, *a.keys, *a.values)}
        out = []
        for proj in layers.projections:
            p = proj.param
            if proj.kind != "up" or p in in_attention or p in self._splits:
                continue
            if any(layers.hidden.get(c) == "mlp" for c in proj.free) and (p, None) not in out:
                d = layers.split_dim(self, p)
                if (p, d) not in out:
                    out.append((p, d))
        out += [(v, d) for v, (kind, d) in self._splits.items() if kind == "hidden"]
        return out

    def keys_values(self) -> list[int]:
        """The key and value projections of every (unfused) attention."""
        return [v for a in self.layers.attention if not a.fused for v in (*a.keys, *a.values)]

    @cached_property
    def loop_slices(self) -> dict[int, list[tuple[int, int]]]:
        """Parameter -> ``(loop body input, dims dropped)`` for each body input standing for
        it: its per-step slice (one dim fewer) or the whole of it."""
        from workbench.core.anatomy.layers import region_operands

        values, params = self.program.values, set(self.parameters)
        out: dict[int, list[tuple[int, int]]] = {}
        for op in self.program.ops:
            for region, outer in zip(op.regions, region_operands(op)):
                for inner, o in zip(region.inputs, outer):
                    if o in params:
                        if values[inner].shape == values[o].shape:
                            out.setdefault(o, []).append((inner, 0))
                        elif values[inner].shape == values[o].shape[1:]:
                            out.setdefault(o, []).append((inner, 1))
        return out

    @cached_property
    def feedback(self) -> dict[int, int]:
        """Output -> the input a training loop feeds it back as: what the step returns shaped
        like an argument (``tree_pairs``); else each parameter's update, its optimizer
        state's in the order it was passed, and a counter made from its input."""
        values, program = self.program.values, self.program
        known = {*self.parameters, *self.optimizer_state, *self.keys}
        out: dict[int, int] = {  # what the update makes, or state it passes through
            o: i
            for o, i in tree_pairs(program).items()
            if i in known
            or (
                values[o].producer is not None
                and program.ops[values[o].producer].phase == "optimizer"
            )
        }
        for p in self.parameters:
            if p in self.new_params:
                out.setdefault(self.new_params[p], p)
            rest = [o for o in self.updates.get(p, ()) if o not in out]
            for s in self.state.get(p, ()):
                match = next(
                    (
                        o
                        for o in rest
                        if (values[o].shape, values[o].dtype) == (values[s].shape, values[s].dtype)
                    ),
                    None,
                )
                if match is not None:
                    out[match] = s
                    rest.remove(match)
        chained = {s for p in self.parameters for s in self.state.get(p, ())}
        for s in self.optimizer_state:
            if s in chained:
                continue
            for o in program.outputs:
                if not isinstance(o, int) or o in out or values[o].producer is None:
                    continue
                same = (values[o].shape, values[o].dtype) == (values[s].shape, values[s].dtype)
                if same and s in program.ops[values[o].producer].operands:
                    out[o] = s
                    break
        return out

    def corrected(self, corrections) -> Anatomy:
        """This anatomy with ``(role, value ids, dim)`` corrections applied in order."""
        from dataclasses import replace

        params, data = list(self.parameters), dict(self.data)
        embeddings, splits = list(self.embeddings), dict(self._splits)
        for role, ids, dim in corrections:
            for v in ids:
                if role in ("none", "data", "parameter"):
                    data.pop(v, None)
                    if v in params:
                        params.remove(v)
                if role == "data":
                    data[v] = dim % len(self.program.values[v].shape)
                elif role == "parameter":
                    params.append(v)
                elif role == "embedding":
                    embeddings = [e for e in embeddings if e[0] != v] + [(v, dim)]
                elif role in ("heads", "hidden"):
                    splits[v] = (role, dim)
        out = replace(
            self,
            parameters=tuple(sorted(set(params))),
            data=tuple(data.items()),
            corrections=self.corrections + tuple(corrections),
            _embeddings=embeddings,
            _splits=splits,
        )
        return out

    def report(self) -> list[Finding]:
        """Everything the workbench sees, for people (``ir.report``)."""
        return report(self)

    def role_of(self, value: int) -> str:
        """ "parameter", "gradient", "optimizer_state", "data", "key" or "activation"."""
        return self._roles.get(value, "activation")

    @cached_property
    def _roles(self) -> dict[int, str]:
        roles = {p: "parameter" for p in self.parameters}
        roles.update({g: "gradient" for g in self.gradients.values()})
        roles.update({s: "optimizer_state" for s in self.optimizer_state})
        roles.update({k: "key" for k in self.keys})
        roles.update({d: "data" for d, _ in self.data})
        for p, outs in self.updates.items():
            for o in outs:
                roles.setdefault(
                    o, "parameter" if self.new_params.get(p) == o else "optimizer_state"
                )
        return roles

    def companions(self, param: int) -> tuple[int, ...]:
        """Values that hold the parameter's layout in a training loop: its optimizer state
        and the outputs its update returns."""
        return (*self.state.get(param, ()), *self.updates.get(param, ()))


@without_gc
def build_anatomy(program) -> Anatomy:
    """Read the roles of ``program``'s values (see the module docstring)."""
    values, ops = program.values, program.ops
    classes = dimension_classes(program)
    phase_readers: list[set[str]] = [set() for _ in values]
    for v, users in enumerate(program.users):
        for u in users:
            phase_readers[v].add(ops[u].phase)
    findings: list[Finding] = []
    keys = tuple(
        i
        for i in program.inputs
        if is_key(values[i])
        or (program.users[i] and all(traits_of(ops[u].primitive).random for u in program.users[i]))
    )
    key_set = set(keys)

    chains = update_chains(program)
    chain_members: dict[int, list[int]] = {}
    for v in range(len(values)):
        if values[v].region_of is None:
            chain_members.setdefault(chains.find(v), []).append(v)
    outputs = [o for o in program.outputs if isinstance(o, int)]
    paired = tree_pairs(program)
    chain_outputs: dict[int, list[int]] = {}  # chain -> its outputs, in output order
    for o in dict.fromkeys(outputs):
        if values[o].region_of is None:
            chain_outputs.setdefault(chains.find(o), []).append(o)
    parameters, state, gradients, updates, new_params = [], {}, {}, {}, {}
    for root, members in chain_members.items():
        if len(members) < 2:
            continue
        outs = tuple(chain_outputs.get(root, ()))
        inputs = [v for v in members if values[v].kind == "input" and v not in key_set]
        read_by_model = [v for v in inputs if phase_readers[v] & {"forward", "backward"}]
        if not read_by_model:  # the update works on a copy (a float32 master) and returns
            # the parameter cast from it: the input that output is fed back as
            read_by_model = list(
                dict.fromkeys(
                    paired[o]
                    for o in outs
                    if o in paired
                    and paired[o] not in key_set
                    and phase_readers[paired[o]] & {"forward", "backward"}
                )
            )
        if len(read_by_model) != 1:
            continue
        (p,) = read_by_model
        grads = [
            v
            for v in members
            if values[v].producer is not None
            and ops[values[v].producer].phase == "backward"
            and "optimizer" in phase_readers[v]
        ]
        if not grads:
            continue
        parameters.append(p)
        gradients[p] = grads[-1]
        state[p] = tuple(v for v in inputs if v != p)
        updates[p] = outs
        # the output returned where the parameter was passed; else the first of its dtype
        same = [o for o in outs if paired.get(o) == p] or [
            o for o in outs if values[o].dtype == values[p].dtype
        ]
        if same:
            new_params[p] = same[0]
    returned = not parameters  # a step that returns its gradients (value_and_grad alone)
    if returned:
        for o, i in paired.items():
            made = values[o].producer
            if (
                i not in key_set
                and made is not None
                and ops[made].phase == "backward"
                and phase_readers[i] & {"forward", "backward"}
            ):
                parameters.append(i)
                gradients[i], state[i], updates[i] = o, (), ()
    parameters.sort()
    in_chains = {s for p in parameters for s in state[p]}
    optimizer_state = sorted(
        in_chains
        | {
            i
            for i in program.inputs
            if i not in key_set and program.users[i] and phase_readers[i] == {"optimizer"}
        }
    )
    param_set, optimizer_set = set(parameters), set(optimizer_state)
    data_inputs = [
        i
        for i in program.inputs
        if i not in param_set
        and i not in key_set
        and i not in optimizer_set
        and values[i].shape
        and phase_readers[i] & {"forward", "backward"}
    ]
    batch_class, sequence_class, data = _batch(program, classes, param_set, data_inputs, findings)
    if parameters:
        findings.insert(
            0,
            Finding(
                "parameter",
                tuple(parameters),
                None,
                "inputs the model reads whose gradient the step returns, shaped like them in "
                "their place (no update in the step)"
                if returned
                else "inputs the model reads whose update the optimizer computes elementwise "
                "from a gradient of the backward pass",
                0.9 if returned else 0.95,
            ),
        )
        findings.insert(
            1,
            Finding(
                "gradient",
                tuple(gradients[p] for p in parameters),
                None,
                "the gradients the step returns"
                if returned
                else "backward-pass values each parameter's update reads",
                0.95,
            ),
        )
    if optimizer_state:
        findings.insert(
            2,
            Finding(
                "optimizer_state",
                tuple(optimizer_state),
                None,
                "inputs only the update reads (moments, master copies, counters)",
                0.9,
            ),
        )
    if keys:
        findings.append(Finding("key", keys, None, "random keys: typed keys or raw key data", 0.9))
    return Anatomy(
        program=program,
        classes=classes,
        parameters=tuple(parameters),
        state=state,
        gradients=gradients,
        updates=updates,
        new_params=new_params,
        optimizer_state=tuple(optimizer_state),
        keys=keys,
        data=data,
        batch_class=batch_class,
        sequence_class=sequence_class,
        findings=findings,
    )


def _one_example(program, classes: DimClasses, data_inputs, c: int) -> bool:
    """Whether every data input carrying class ``c`` has a dim of size 1 before it."""
    leads = []  # the dims before c, in each data input that has it
    for i in data_inputs:
        shape = program.values[i].shape
        dims = classes.dims_of(i, len(shape))
        if c in dims:
            leads.append(shape[: dims.index(c)])
    return bool(leads) and all(1 in lead for lead in leads)


def _batch(program, classes: DimClasses, params: set[int], data_inputs, findings):
    """The batch class: carried by most data inputs, by no parameter, by no op twice; ties go
    to the earlier dimension. The runner-up that attention carries twice is the sequence."""
    values = program.values
    param_classes = {c for p in params for c in classes.dims_of(p, len(values[p].shape))}
    score: dict[int, list] = {}
    for i in data_inputs:
        for d, c in enumerate(classes.dims_of(i, len(values[i].shape))):
            if c in param_classes or values[i].shape[d] == 1:  # size 1: nothing to split
                continue
            entry = score.setdefault(c, [0, d])
            entry[0] += 1
            entry[1] = min(entry[1], d)
    if not score:
        return None, None, tuple((i, None) for i in data_inputs)
    ranked = sorted(score, key=lambda c: (-score[c][0], c in classes.conflicts, score[c][1]))
    if ranked[0] in classes.conflicts and _one_example(program, classes, data_inputs, ranked[0]):
        # a class an op carries twice (attention's sequence), behind a leading dim of size 1
        # in every data input that has it: one example a step, and the sequence is no batch
        return None, ranked[0], tuple((i, None) for i in data_inputs)
    batch = ranked[0]
    ties = [c for c in ranked[1:] if score[c][0] == score[batch][0]]
    sure = 0.9 if not ties else (0.75 if batch not in classes.conflicts else 0.5)
    data = []
    for i in data_inputs:
        dims = classes.dims_of(i, len(values[i].shape))
        data.append((i, dims.index(batch) if batch in dims else None))
    with_batch = tuple(i for i, d in data if d is not None)
    why = f"the dimension class {len(with_batch)} of {len(data_inputs)} data inputs carry"
    why += ", no parameter carries"
    why += ", and no op carries twice" if batch not in classes.conflicts else ""
    if ties:
        why += (
            f"; {len(ties)} other class(es) as often, which an op carries twice (attention's "
            "sequence)"
            if batch not in classes.conflicts and all(c in classes.conflicts for c in ties)
            else f"; {len(ties)} other class(es) tie, the earlier dimension wins"
        )
    findings.append(
        Finding(
            "data",
            tuple(data_inputs),
            None,
            "inputs the forward pass reads that are neither parameters, optimizer state nor keys",
            0.9,
        )
    )
    findings.append(Finding("batch", with_batch, data[0][1] if data else None, why, sure))
    # the sequence: a class of the data besides the batch that attention carries twice (a
    # learned position embedding may carry it too)
    carried = Counter(
        c
        for i in data_inputs
        for c in set(classes.dims_of(i, len(values[i].shape)))
        if c != batch and c in classes.conflicts
    )
    sequence = max(carried, key=lambda c: (carried[c], -c), default=None)
    if sequence is not None:
        seq_values = tuple(
            i for i in data_inputs if sequence in classes.dims_of(i, len(values[i].shape))
        )
        findings.append(
            Finding(
                "sequence",
                seq_values,
                classes.dims_of(seq_values[0], len(values[seq_values[0]].shape)).index(sequence),
                "a class of the data inputs besides the batch that attention carries twice "
                "(queries and keys)",
                0.75,
            )
        )
    return batch, sequence, tuple(data)
