"""The third-party model matrix: named strategies with no selectors, on models the project
did not write, each checked for its textbook layout (see docs/anatomy.md for the table)."""

from __future__ import annotations

import warnings
from collections import Counter
from functools import cache

import pytest

import workbench as wb
from workbench.models.external import EXTERNAL, build_external

# compiles and runs partitioned programs: in the full suite (CI), not the fast lane
pytestmark = pytest.mark.slow

MESH = wb.Mesh({"data": 2, "model": 4})
MODELS = list(EXTERNAL)
#: grouped-query attention with 2 KV heads: they cannot split 4 ways (see the MP test)
GQA = {"hf_llama", "hf_mistral"}


@cache
def program(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = build_external(name, "tiny", abstract=True)
        return wb.capture(ex.fn, *ex.args)


def kinds(session):
    return Counter((c.kind, c.axes) for c in session.collectives())


@pytest.mark.parametrize("name", MODELS)
def test_bp_tiles_the_data_and_all_reduces_every_gradient(name):
    p = program(name)
    s = wb.Session(p, MESH, [wb.BP("data")])
    a = p.anatomy()
    assert a.data and all(
        s.state.shardings[v].dim_of("data") == d for v, d in a.data if d is not None
    )
    reduced = {c.value for c in s.collectives() if c.kind == "all-reduce" and c.axes == ("data",)}
    pending = {v for v in range(len(p.values)) if s.state.shardings[v].reduction_of("data")}
    # a gradient summed from a reduced one (a tied table's two uses) may be reduced upstream
    missing = {a.gradients[q] for q in a.parameters} - reduced - pending
    assert len(missing) <= 1, [p.values[v].name for v in missing]
    assert kinds(s)[("all-reduce", ("data",))] >= len(a.parameters) and not s.conflicts


@pytest.mark.parametrize("name", MODELS)
def test_mp_splits_up_projections_on_their_output_and_down_ones_on_their_input(name):
    p = program(name)
    s = wb.Session(p, MESH, [wb.MP("model")])
    a = p.anatomy()
    layers = a.layers
    assert len(layers.attention) == 2 and layers.repeats >= 2
    for proj in layers.projections:
        sh = s.state.shardings[proj.param]
        if proj.kind == "up" and proj.param in {v for v, _ in a.hidden_splits()}:
            assert sh.dim_of("model") == layers.split_dim(a, proj.param), p.values[proj.param].name
    down_projections = [
        q
        for q in layers.projections
        if q.kind == "down" and any(c in layers.hidden for c in q.contracted)
    ]
    assert down_projections
    forward_reduces = [
        c for c in s.collectives()
        if c.kind == "all-reduce" and c.axes == ("model",) and c.op is not None
        and p.ops[c.op].phase == "forward"
    ]  # fmt: skip
    if name in GQA:  # 2 KV heads on a 4-way axis: the repeated keys and values
        # cannot split where their 2 heads become 4; propagation stops there (recorded) and
        # the plan gathers them, as Megatron replicates KV heads when TP exceeds them
        assert s.conflicts and all("reshape" in c.op for c in s.conflicts)
    else:
        assert not s.conflicts
    assert len(forward_reduces) == downs(p)  # one per block: two per layer


def test_a_fused_qkv_kernel_is_kept_whole_and_split_after_the_matmul():
    p = program("hf_gpt2")
    a = p.anatomy()
    (att, *_) = a.layers.attention
    assert att.fused
    s = wb.Session(p, MESH, [wb.MP("model")])
    c_attn = p.value("params/transformer/h/0/attn/c_attn/kernel")
    assert not s.state.shardings[c_attn.id].uses("model")
    for v in (*att.queries, *att.keys, *att.values):
        assert s.state.shardings[v].uses("model")


@pytest.mark.parametrize("name", MODELS)
def test_z3_shards_parameters_and_state_and_gathers_them(name):
    p = program(name)
    s = wb.Session(p, MESH, [wb.BP("data"), wb.Z3("data")])
    a = p.anatomy()
    sharded = [q for q in a.parameters if s.state.shardings[q].uses("data")]
    assert len(sharded) >= len(a.parameters) - 2  # scalars and odd sizes may stay whole
    for q in sharded:
        for u in a.state.get(q, ()):
            assert s.state.shardings[u].uses("data"), p.values[u].name
    k = kinds(s)
    assert k[("all-gather", ("data",))] >= len(sharded)
    assert k[("reduce-scatter", ("data",))] + k[("all-reduce", ("data",))] >= len(sharded)


#: models with no table a gather looks rows up in, and why
NO_TABLE = {"nnx_vit": "patches are embedded by a convolution, positions added as a parameter"}


@pytest.mark.parametrize("name", MODELS)
def test_emb_splits_the_table_on_its_vocabulary(name):
    p = program(name)
    if name in NO_TABLE:
        assert not p.anatomy().embeddings
        with pytest.raises(wb.WorkbenchError, match="no embedding table"):
            wb.Session(p, MESH, [wb.EMB("model")])
        return
    s = wb.Session(p, MESH, [wb.EMB("model")])
    assert p.anatomy().embeddings
    for table, vocab in p.anatomy().embeddings:
        size = p.values[table].shape[vocab]
        if size % 4 == 0:
            assert s.state.shardings[table].dim_of("model") == vocab


#: where Megatron-SP's forward is not one gather in and one reduce-scatter out per block
SP_EXCEPTIONS = {
    "hf_gpt2": "the fused c_attn: the attention block's input is gathered once for the whole "
    "fused matmul and its q/k/v split locally, so the first block's pattern differs",
    "hf_llama": "2 KV heads on a 4-way axis: MP conflicts (see the MP test)",
    "hf_mistral": "2 KV heads on a 4-way axis, as hf_llama: MP conflicts (see the MP test)",
    "hf_opt": "OPT's MLP runs on [batch * seq, D] (FlaxOPTDecoderLayer flattens the tokens "
    "before fc1): the sequence merges with the data-tiled batch, so only the attention blocks "
    "reduce-scatter out",
    "haiku_lm": "Haiku's attention reshapes its heads inside the projection module; MP conflicts",
    "hf_bert": "post-LN: the first block's input is the embeddings' layer norm, computed whole as "
    "under MP, so it needs no gather; the q/k/v cotangents are summed outside the block, so its "
    "backward reduce-scatters each",
}


def downs(program):
    """Blocks (attention, MLP) as their down projections: one each."""
    layers = program.anatomy().layers
    return sum(
        1
        for q in layers.projections
        if q.kind == "down" and any(c in layers.hidden for c in q.contracted)
    )


#: models SP does not apply to, and why
NO_SP = {
    "nnx_vit": "an encoder over 17 tokens (the cls token and 16 patches): no residual stream "
    "with a sequence dimension is seen, and 17 does not split 4 ways",
}


@pytest.mark.parametrize("name", MODELS)
def test_sp_gathers_into_each_block_and_reduce_scatters_out(name):
    p = program(name)
    if name in NO_SP:
        with pytest.raises(wb.WorkbenchError, match="no residual stream"):
            wb.Session(p, MESH, [wb.BP("data"), wb.MP("model"), wb.SP("model")])
        return
    s = wb.Session(p, MESH, [wb.BP("data"), wb.MP("model"), wb.SP("model")])
    assert p.anatomy().sequence_class is not None
    forward = Counter(
        c.kind
        for c in s.collectives()
        if c.axes == ("model",) and c.op is not None and p.ops[c.op].phase == "forward"
    )
    if name in SP_EXCEPTIONS:
        return
    blocks = downs(p)
    assert not s.conflicts
    # one reduce-scatter out of each block; gathers into each (and of a mask or two)
    assert forward["reduce-scatter"] == blocks and forward["all-gather"] >= blocks


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nnx_lm", "hf_bert"])
def test_auto_on_the_model_axis_is_at_least_as_good_as_mp(name):
    """The search, not seeded with MP's plan, finds one whose estimate is no worse."""
    from workbench.core import hardware as hw

    p = program(name)
    mp = wb.Session(p, MESH, [wb.BP("data"), wb.MP("model")]).estimate(hw.H100)
    auto = wb.Session(p, MESH, [wb.BP("data"), wb.Auto("model", budget=150)]).estimate(hw.H100)
    assert auto.step_s <= mp.step_s * 1.0001
