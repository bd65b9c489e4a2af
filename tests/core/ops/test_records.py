"""One record per primitive: every facet present, the queries, and the fusion classes that
reproduce the simulator's tables (with each decision where they were silent)."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from workbench.core import ops
from workbench.core.ops import RECORDS
from workbench.core.ops.costs import OpCost, op_cost
from workbench.core.ops.local import runs_unchanged
from workbench.core.ops.mapping import TensorType
from workbench.core.ops.record import NO_TRAITS, Barrier, Control, Fusion, Fusions, Traits

#: The simulator's fusion tables as they stood before the records (estimate/fusion.py).
TABLES = {
    "fusible": {
        "abs", "add", "add_any", "and", "broadcast_in_dim", "ceil", "clamp", "convert_element_type",
        "copy", "cos", "div", "eq", "erf", "exp", "exp2", "expm1", "floor", "ge", "gt", "integer_pow",
        "iota", "is_finite", "le", "log", "log1p", "logistic", "lt", "max", "min", "mul", "name", "ne",
        "neg", "not", "or", "pow", "reshape", "round", "rsqrt", "select_n", "sign", "sin", "sqrt",
        "square", "squeeze", "stop_gradient", "sub", "tan", "tanh", "xor",
    },
    "expensive": {
        "cos", "div", "erf", "exp", "exp2", "expm1", "log", "log1p", "logistic", "pow", "rsqrt",
        "sin", "sqrt", "tan", "tanh",
    },
    "copying": {"dot_general", "conv_general_dilated"},
    "free": {"name", "reshape", "squeeze", "expand_dims", "stop_gradient", "pvary"},
}  # fmt: skip
TABLES["fusing_readers"] = TABLES["fusible"] | {
    "reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin"
}  # fmt: skip
LISTED = set().union(*TABLES.values())


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_every_record_has_every_facet(name):
    rec = RECORDS[name]
    assert rec.primitive == name and rec.family in {
        "collectives", "control_flow", "conv", "dot", "elementwise", "indexing", "misc",
        "random", "reduce", "shape", "wrappers",
    }  # fmt: skip
    assert callable(rec.rule)
    if isinstance(rec.rule, Barrier):
        assert len(rec.rule.reason) > 20, "a barrier says why"
    assert callable(rec.cost)
    assert isinstance(rec.fusion, Fusions) and isinstance(rec.fusion.cpu, Fusion)
    f = rec.fusion.cpu
    assert not f.loop or f.fuses_inputs, "a loop op reads its fused inputs"
    assert not f.expensive or f.loop, "only a fusible op is computed once for its readers"
    assert callable(rec.local)
    assert isinstance(rec.traits, Traits)
    if rec.traits.control is not None:
        assert isinstance(rec.traits.control, Control)
        assert rec.traits.control.kind in ("loop", "branch")
    if rec.traits.call is not None:
        assert rec.traits.call.param and isinstance(rec.rule, Barrier)


def test_a_primitive_is_registered_once():
    with pytest.raises(ValueError, match="'exp' already has a record"):
        ops.register("exp", cost=ops.costs.free, fusion=Fusion())(Barrier("a second one"))


def test_queries_on_an_unknown_primitive():
    assert ops.record("mystery") is None and ops.traits("mystery") is NO_TRAITS
    assert ops.local_lowering("mystery") is runs_unchanged
    assert ops.local_lowering("exp") is runs_unchanged
    assert ops.local_lowering("iota") is not runs_unchanged
    t = TensorType((8, 4), np.float32)
    assert op_cost("mystery", {}, [t], [t]) == OpCost(0.0, 0.0, 256)


def test_the_calls_capture_inlines_in_their_order():
    assert ops.calls() == {
        "jit": "jaxpr",
        "pjit": "jaxpr",
        "closed_call": "call_jaxpr",
        "core_call": "call_jaxpr",
        "remat2": "jaxpr",
        "checkpoint": "jaxpr",
        "custom_jvp_call": "call_jaxpr",
        "custom_vjp_call": "call_jaxpr",
        "custom_vjp_call_jaxpr": "fun_jaxpr",
    }
    assert ops.traits("jit").call.scope == "name" and ops.traits("remat2").call.scope is None


def test_traits_replace_the_old_lists():
    def having(field):
        return {n for n, r in RECORDS.items() if getattr(r.traits, field)}

    assert having("transparent") == {
        "convert_element_type", "reshape", "transpose", "copy", "copy_p", "name", "squeeze",
        "expand_dims", "reduce_precision", "sharding_constraint", "reshard",
    }  # fmt: skip
    assert having("random") == {
        "random_wrap", "random_seed", "random_bits", "random_split", "random_fold_in",
        "threefry2x32",
    }  # fmt: skip
    assert having("bitwise") == {"bitcast_convert_type", "random_bits", "threefry2x32"}
    assert having("rounding") == {"reduce_precision"}
    assert having("control") == {"scan", "while", "cond"}
    assert having("tag") == {"name"} and ops.traits("name").tag == "name"
    assert having("contraction") == {"dot_general"}
    assert having("convolution") == {"conv_general_dilated"}
    assert having("lookup") == {"gather"} and having("accumulates") == {"add_any"}
    assert having("constraint") == {"sharding_constraint", "reshard"} and having("cast") == {
        "convert_element_type"
    }
    assert having("broadcasts") == {"broadcast_in_dim", "iota", "tile"} and having("permutes") == {
        "transpose"
    }


def test_cpu_fusion_classes_reproduce_the_tables_for_every_primitive_they_list():
    sets = dataclasses.asdict(ops.fusion_sets("cpu"))
    for table, names in TABLES.items():
        assert sets[table] & LISTED == names, table


def test_every_primitive_the_zoo_captures_keeps_its_class():
    """What the golden estimates price: the classes of the zoo's primitives, listed or not."""
    from tests.core.zoo import ZOO, program

    sets = dataclasses.asdict(ops.fusion_sets("cpu"))
    used = set().union(*(program(name).primitives for name in ZOO))
    for table, names in TABLES.items():
        assert sets[table] & used == names & used, table


def test_every_class_the_tables_did_not_give_says_why():
    sets = dataclasses.asdict(ops.fusion_sets("cpu"))
    decided = {n for names in sets.values() for n in names} - LISTED
    unexplained = sorted(n for n in decided if not RECORDS[n].fusion.cpu.why)
    assert not unexplained
    # where XLA:CPU and the tables disagree, the tables' class stays and says so
    for name in ("sin", "cos", "tan"):
        assert RECORDS[name].fusion.cpu.expensive and "XLA:CPU" in RECORDS[name].fusion.cpu.why


def test_the_elementwise_tables_agree_with_costs_and_fusion():
    """Every elementwise primitive XLA:CPU fuses is fusible; atan, atan2, cbrt (transcendental
    in the costs) are expensive, as XLA:CPU computes them once for several readers."""
    sets = ops.fusion_sets("cpu")
    elementwise = [n for n, r in RECORDS.items() if r.family == "elementwise"]
    not_fused = sorted(n for n in elementwise if n not in sets.fusible)
    assert not_fused == ["igamma", "igammac"]
    assert {"atan", "atan2", "cbrt", "sinh", "rem"} <= sets.expensive
    transcendental = [
        n
        for n in elementwise
        if n not in ("igamma", "igammac")
        and op_cost(n, {}, [TensorType((4,))], [TensorType((4,))]).transcendentals
    ]
    assert set(transcendental) <= sets.expensive


def test_other_backends_are_not_read_yet():
    with pytest.raises(ValueError, match="no gpu fusion classes"):
        ops.fusion_sets("gpu")
    with pytest.raises(ValueError, match="no backend 'npu'"):
        ops.fusion_sets("npu")


def test_an_explicit_barrier_warns_its_reason_once():
    t = TensorType((4, 4), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ops.mapping_for("fft", {}, [t], [t]).barrier
    barrier = Barrier("the reason it gives")
    with pytest.warns(UserWarning, match="treats primitive 'odd' as a barrier: the reason it"):
        barrier.warn("odd")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        barrier.warn("odd")  # once
