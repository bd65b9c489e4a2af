"""The anatomy reads roles from structure: the zoo's roles, a renamed zoo, corrections."""

from __future__ import annotations

import inspect
import random
import string
from collections import Counter

import jax
import pytest

import workbench as wb
from tests.core.zoo import program as zoo_program
from workbench.models import build

MESH = wb.Mesh({"batch": 2, "model": 4})


def names(program, ids):
    return sorted(program.values[i].name for i in ids)


def test_the_lm_roles():
    program = zoo_program("lm")
    a = program.anatomy()
    assert names(program, a.parameters) == program.names("params/**")
    assert {program.values[a.gradients[p]].name for p in a.parameters} == set(
        program.names("grads/**")
    )
    assert set(names(program, a.optimizer_state)) == set(program.names("opt_state/**"))
    assert [(program.values[v].name, d) for v, d in a.data] == [
        ("batch/targets", 0),
        ("batch/tokens", 0),
    ]
    wq = program.value("params/layers/0/attn/wq").id
    assert names(program, a.state[wq]) == [
        "opt_state/m/layers/0/attn/wq",
        "opt_state/v/layers/0/attn/wq",
    ]
    assert program.values[a.new_params[wq]].name == "out/params/layers/0/attn/wq"
    layers = a.layers
    assert layers.repeats == 2 and len(layers.attention) == 2
    first = layers.attention[0]
    assert names(program, first.queries) == ["params/layers/0/attn/wq"]
    assert names(program, first.output) == ["params/layers/0/attn/wo"]
    assert not first.fused
    assert [(program.values[t].name, d) for t, d in layers.embeddings] == [("params/embed", 0)]
    assert [(program.values[t].name, d) for t, d in layers.heads_out] == [("params/unembed", 1)]
    assert [(program.values[p].name, d) for p, d in a.hidden_splits()] == [
        ("params/layers/0/mlp/w_in", 1),
        ("params/layers/1/mlp/w_in", 1),
    ]


@pytest.mark.parametrize("model", ["lm_scan", "mlp", "cnn", "gnn"])
def test_parameters_and_data_of_every_zoo_model(model):
    program = zoo_program(model)
    a = program.anatomy()
    assert names(program, a.parameters) == program.names("params/**")
    assert all(program.values[v].name.startswith("batch/") for v, _ in a.data)
    assert any(d == 0 for _, d in a.data)
    for f in a.findings:
        assert f.evidence and 0 < f.confidence <= 1


def test_phases_come_from_dataflow_not_scope_names():
    program = zoo_program("lm")
    for op in program.ops:
        if op.parent is None and "optimizer" in op.scope:
            assert op.phase == "optimizer", op.name


# -- the same model under other names ------------------------------------------------------


def _random_names(rng, n):
    out = set()
    while len(out) < n:
        out.add("".join(rng.choice(string.ascii_lowercase) for _ in range(7)))
    return list(out)


class Renamer:
    """Random, order-shuffling names for every dict key, scope and tag of a step."""

    def __init__(self, seed=0):
        self.rng = random.Random(seed)
        self.table: dict[str, str] = {}

    def name(self, key: str) -> str:
        if key not in self.table:
            self.table[key] = _random_names(self.rng, 1)[0]
        return self.table[key]

    def tree(self, x, back=False):
        inverse = {v: k for k, v in self.table.items()}
        if isinstance(x, dict):
            return {
                (inverse[k] if back else self.name(k)): self.tree(v, back) for k, v in x.items()
            }
        if isinstance(x, list | tuple):
            return [self.tree(v, back) for v in x]
        return x


def renamed(model, monkeypatch, seed=0):
    ex = build(model, "tiny", abstract=True)
    r = Renamer(seed)
    args = [r.tree(a) for a in ex.args]
    scope, tag = jax.named_scope, wb.tag
    monkeypatch.setattr(jax, "named_scope", lambda n: scope(r.name(n)))
    monkeypatch.setattr(wb, "tag", lambda x, n: tag(x, r.name(n)))

    def qzx(*args):  # other argument names (arg0, arg1...), renamed keys
        out = ex.fn(*(r.tree(a, back=True) for a in args))
        return r.tree(tuple(out))

    return wb.capture(qzx, *args), r


def footprint(program, session):
    shardings = Counter(
        (
            program.values[v].kind,
            program.values[v].shape,
            str(session.state.shardings[v]),
        )
        for v in range(len(program.values))
    )
    collectives = Counter(
        (c.kind, c.axes, c.bytes, str(c.src), str(c.dst)) for c in session.collectives()
    )
    return shardings, collectives


@pytest.mark.parametrize(
    "model, schedule",
    [
        pytest.param(
            "lm", [wb.BP("batch"), wb.MP("model"), wb.Z3("batch")], marks=pytest.mark.slow
        ),  # seconds: full suite only
        ("lm", [wb.EMB("model")]),
        ("lm", [wb.Z2("batch"), wb.MQ("model")]),
        ("lm_scan", [wb.BP("batch"), wb.MP("model"), wb.Z3("batch")]),
        ("mlp", [wb.BP("batch"), wb.Z3("model")]),
        pytest.param(
            "cnn", [wb.BP("batch"), wb.Z3("model")], marks=pytest.mark.slow
        ),  # seconds: full suite only
        ("gnn", [wb.BP("batch"), wb.Z2("model")]),
    ],
    ids=str,
)
def test_renamed_inputs_and_scopes_give_the_same_plan(model, schedule, monkeypatch):
    original = zoo_program(model)
    program, r = renamed(model, monkeypatch)
    assert not set(program.names()) & set(original.names()) - {"const"}
    a = wb.Session(original, MESH, schedule)
    b = wb.Session(program, MESH, schedule)
    assert footprint(original, a) == footprint(program, b)
    tops = list(inspect.signature(build(model, "tiny").fn).parameters)
    for v in original.input_values:  # each input exactly as its renamed self
        top, *path = v.name.split("/")
        renamed_name = "/".join([f"arg{tops.index(top)}",
                                 *(r.name(p) if not p.isdigit() else p for p in path)])  # fmt: skip
        assert b.sharding(renamed_name) == a.sharding(v.name), v.name


# -- corrections -------------------------------------------------------------------------


def test_a_role_correction_is_a_step_of_the_schedule(tmp_path):
    program = zoo_program("gnn")
    s = wb.Session(program, MESH)
    s.apply(wb.BP("batch"))
    assert not s.sharding("batch/senders").uses("batch")
    s.undo()
    s.apply(wb.Role("batch/{senders,receivers}", "data", dim=0))
    s.apply(wb.BP("batch"))
    assert s.sharding("batch/senders").dim_of("batch") == 0
    assert "Role(selector='batch/{senders,receivers}', role='data', dim=0)" in s.export_code()
    path = s.save(tmp_path / "s.json")
    again = wb.Session.load(program, path)
    assert again.history == s.history
    assert again.sharding("batch/senders") == s.sharding("batch/senders")
    s.undo()
    s.undo()
    assert s.history == (wb.BP("batch"),) or s.history == ()


def test_a_bad_correction_says_what_would_work():
    s = wb.Session(zoo_program("lm"), MESH)
    with pytest.raises(wb.WorkbenchError, match="role must be one of"):
        s.apply(wb.Role("batch/tokens", "batch", dim=0))
    with pytest.raises(wb.WorkbenchError, match="needs dim="):
        s.apply(wb.Role("batch/tokens", "data"))
    assert s.step == 0


# -- sequence parallelism from block interiors -------------------------------------------------


def downs(program):
    """Blocks (attention, MLP) as their down projections: one each."""
    layers = program.anatomy().layers
    return sum(
        1
        for q in layers.projections
        if q.kind == "down" and any(c in layers.hidden for c in q.contracted)
    )


@pytest.mark.parametrize("model", ["lm", "lm_scan"])
def test_sp_finds_the_blocks_without_their_scope_names(model):
    """Megatron-SP: the stream split on the sequence, each block's input gathered and its
    output reduce-scattered (forward), found from the projections, not the scopes."""
    program = zoo_program(model)
    s = wb.Session(program, MESH, [wb.BP("batch"), wb.MP("model"), wb.SP("model")])
    assert model == "lm_scan" or not s.conflicts  # (the scanned MLP's backward conflicts, as
    # it did when SP's blocks were named by scope)
    forward = Counter(
        c.kind
        for c in s.collectives()
        if c.axes == ("model",) and c.op is not None and program.ops[c.op].phase == "forward"
    )
    blocks = downs(program)
    assert forward["reduce-scatter"] == blocks and forward["all-gather"] >= blocks
    resid = "layer0/resid_mid" if model == "lm" else None
    if resid:
        assert s.sharding(resid).dim_of("model") == 1  # the stream, split on its sequence


@pytest.mark.slow
def test_sp_runs_like_the_unpartitioned_step():
    ex = build("lm", "tiny")
    program = wb.capture(ex.fn, *ex.args)
    s = wb.Session(program, MESH, [wb.BP("batch"), wb.MP("model"), wb.SP("model")])
    assert s.run(repeats=1).matches


@pytest.mark.parametrize(
    "model, tactic, message",
    [
        (
            "mlp",
            wb.EMB("model"),
            r"EMB\('model', dim='vocab'\): the workbench sees no embedding table",
        ),
        ("mlp", wb.SP("model"), r"SP\('model'\): the workbench sees no residual stream"),
        ("cnn", wb.MQ("model"), r"MQ\('model'\): the workbench sees no attention queries"),
    ],
)
def test_a_strategy_with_nothing_to_act_on_says_what_would_work(model, tactic, message):
    s = wb.Session(zoo_program(model), MESH)
    with pytest.raises(wb.WorkbenchError, match=message):
        s.apply(tactic)
    assert s.step == 0


def test_bp_on_a_step_without_data_says_what_would_work():
    def step(t):  # a scalar input: nothing with a batch dimension
        return t * 2.0

    s = wb.Session(wb.capture(step, jax.ShapeDtypeStruct((), "float32")), MESH)
    with pytest.raises(
        wb.WorkbenchError, match=r"sees no data input with a batch dimension.*inputs= and dim="
    ):
        s.apply(wb.BP("batch"))
    assert s.step == 0


def test_a_step_that_returns_its_gradients_has_parameters():
    # jax.value_and_grad alone, as JAX's docs write a first training step: no update in
    # the step, so the parameters are the inputs whose gradients it returns in their place
    import jax
    import jax.numpy as jnp

    def loss(params, x):
        w1, w2 = params
        return jnp.mean((jax.nn.relu(x @ w1) @ w2) ** 2)

    params = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((64, 128), (128, 64))]
    program = wb.capture(
        jax.value_and_grad(loss), params, jax.ShapeDtypeStruct((512, 64), jnp.float32)
    )
    a = program.anatomy()
    names = {program.values[v].name for v in a.parameters}
    assert names == {"params/0", "params/1"}
    assert [program.values[v].name for v, _ in a.data] == ["x"] and a.data[0][1] == 0
    # so data parallelism splits the batch, not the features it shares with a weight
    s = wb.Session(program, wb.Mesh({"data": 8}), [wb.BP("data")])
    assert str(s.sharding("x")) == "f32[512@data,64]" and not s.sharding("params/0").dims[0]
