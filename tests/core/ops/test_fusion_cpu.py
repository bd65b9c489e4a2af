"""The CPU fusion classes, read from what XLA:CPU compiles (``compile().as_text()``): one
representative primitive per class (fast), and every class the records decided where the
simulator's tables were silent (slow)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from workbench.core import ops

X = jnp.linspace(0.1, 0.9, 64 * 128, dtype=jnp.float32).reshape(64, 128)
Y = X[::-1] + 0.5
XI = jnp.arange(64 * 128, dtype=jnp.int32).reshape(64, 128) % 7 + 1
W = jnp.ones((128, 32), jnp.float32)


def entry(fn, *args) -> list[tuple[str, str, list[str], str]]:
    """``(name, opcode, operands, rest)`` of each instruction of the compiled entry computation."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    body = text[text.index("\nENTRY") :].split("{", 1)[1]
    out = []
    for line in body.splitlines():
        m = re.match(r"\s*(?:ROOT )?(%[\w.\-]+) = .*?\s([a-z][\w\-]*)\(([^)]*)\)(.*)$", line)
        if m:
            name, opcode, args, rest = m.groups()
            out.append((name, opcode, re.findall(r"%[\w.\-]+", args), rest))
    return out


def kernels(fn, *args) -> list[tuple[str, str, list[str], str]]:
    return [i for i in entry(fn, *args) if i[1] not in ("parameter", "tuple", "constant")]


def one_loop_kernel(fn, *args) -> bool:
    """Whether ``fn`` compiles to a single loop fusion: everything in it fused."""
    ks = kernels(fn, *args)
    return len(ks) == 1 and ks[0][1] == "fusion" and "kind=kLoop" in ks[0][3]


def computed_once(g, *args) -> bool:
    """Whether ``g``'s value, read by a matmul and by an elementwise kernel, is computed once
    (both read one buffer, or one buffer of the dear part it is made from: ``asin`` is
    ``2 atan2(...)``) rather than recomputed inside the elementwise kernel."""
    ins = entry(lambda w, *a: (g(*a) @ w, g(*a) * 3.0), W, *args)
    made = {i[0]: i for i in ins}
    dot = next(i for i in ins if "kCustom" in i[3] or i[1] == "dot")
    source = made[dot[2][0]]
    while source[1] != "parameter":
        if len([i for i in ins if source[0] in i[2] and i[1] != "tuple"]) > 1:
            return True
        if len(source[2]) != 1:
            return False
        source = made[source[2][0]]
    return False


CPU = ops.fusion_sets("cpu")


# -- one representative per class ---------------------------------------------------------------
def test_loop_ops_fuse_into_one_kernel_and_cheap_ones_are_recomputed():
    assert "neg" in CPU.fusible and "neg" not in CPU.expensive
    assert one_loop_kernel(lambda x: lax.neg(x) * 2.0 + 1.0, X)
    assert not computed_once(lax.neg, X)


def test_expensive_ops_fuse_but_are_computed_once_for_several_readers():
    assert "exp" in CPU.fusible and "exp" in CPU.expensive
    assert one_loop_kernel(lambda x: jnp.exp(x) * 2.0 + 1.0, X)
    assert computed_once(jnp.exp, X)


def test_a_reduction_fuses_the_chain_it_reads():
    assert "reduce_sum" in CPU.fusing_readers and "reduce_sum" not in CPU.fusible
    (k,) = kernels(lambda x: jnp.sum(x * 2.0 + 1.0, axis=1), X)
    assert k[1] == "fusion"


def test_a_row_major_reshape_is_a_bitcast():
    assert "reshape" in CPU.free
    ins = entry(lambda x, w: x.reshape(256, 32) @ w[:32], X, W)
    bitcast = next(i for i in ins if i[1] == "bitcast")
    assert ins[[i[0] for i in ins].index(bitcast[2][0])][1] == "parameter"


def test_a_matmul_copies_an_operand_held_in_another_order():
    assert "dot_general" in CPU.copying
    x, y = jnp.ones((16, 4, 32)), jnp.ones((4, 32, 8))  # the batch dim of x is not leading
    ins = entry(lambda a, b: jnp.einsum("ibj,bjk->bik", a, b), x, y)
    dot = next(i for i in ins if "kCustom" in i[3] or i[1] == "dot")
    made = {i[0]: i for i in ins}
    assert made[dot[2][0]][1] in ("fusion", "copy", "transpose")  # x reordered first


def test_other_ops_are_kernels_of_their_own():
    assert "sort" not in CPU.fusible | CPU.fusing_readers | CPU.free
    ks = kernels(lambda x: jnp.sort(x * 2.0 + 1.0, axis=1), X)
    assert [k[1] for k in ks] == ["fusion", "sort"]


# -- every class decided from XLA:CPU where the tables were silent ------------------------------
def _int(f):
    return lambda *a: f(*(x.astype(jnp.int32) for x in a)).astype(jnp.float32)


UNARY = {n: getattr(lax, n) for n in (
    "acos", "acosh", "asin", "asinh", "atan", "atanh", "bessel_i0e", "bessel_i1e", "cbrt",
    "cosh", "digamma", "erf_inv", "erfc", "lgamma", "sinh", "sin", "cos", "tan",
)}  # fmt: skip
UNARY |= {
    "clz": _int(lax.clz),
    "population_count": _int(lax.population_count),
    "reduce_precision": lambda x: lax.reduce_precision(x, 5, 10),
    "real": lambda x: lax.real(lax.complex(x, x) * 2.0),
    "imag": lambda x: lax.imag(lax.complex(x, x) * 2.0),
    "conj": lambda x: lax.real(lax.conj(lax.complex(x, x) * 2.0) * lax.complex(x, 1.0)),
    "bitcast_convert_type": lambda x: lax.bitcast_convert_type(x, jnp.int32).astype(jnp.float32),
}
BINARY = {n: getattr(lax, n) for n in ("atan2", "rem", "nextafter", "igamma", "igammac")}
BINARY |= {
    n: _int(getattr(lax, n))
    for n in ("shift_left", "shift_right_arithmetic", "shift_right_logical")
}
BINARY["complex"] = lambda x, y: (lax.complex(x, y) * lax.complex(y, x)).real
BINARY |= {  # the total-order comparisons of sorting, as numbers
    n: (lambda p: lambda x, y: p.bind(x, y).astype(jnp.float32))(getattr(lax, n + "_p"))
    for n in ("eq_to", "le_to", "lt_to")
}
DECIDED = {n: (g, (X,)) for n, g in UNARY.items()} | {n: (g, (X, Y)) for n, g in BINARY.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DECIDED))
def test_decided_elementwise_classes_match_xla_cpu(name):
    g, args = DECIDED[name]
    fusion = ops.record(name).fusion.cpu
    assert fusion.why, f"{name}: a decided class says why"
    fused = one_loop_kernel(lambda *a: g(*a) * 2.0 + 1.0, *args)
    assert fused == fusion.loop, name
    if fusion.loop and name not in ("sin", "cos", "tan"):
        assert computed_once(g, *args) == fusion.expensive, name
    elif fusion.loop:  # the tables' class is kept; XLA:CPU recomputes it in each reader
        assert fusion.expensive and not computed_once(g, *args)


@pytest.mark.slow
def test_tile_fuses_into_the_loop_kernel_that_reads_it():
    fusion = ops.record("tile").fusion.cpu
    assert fusion.loop and fusion.why
    assert one_loop_kernel(lambda x: jnp.tile(x * 2.0, (2, 1)) + 1.0, X)


VANISHING = {
    "sharding_constraint": lambda x: lax.with_sharding_constraint(
        x, jax.sharding.SingleDeviceSharding(jax.devices()[0])
    ),
    "device_put": jax.device_put,
    "optimization_barrier": lax.optimization_barrier,
    "random_wrap": lambda x: jax.random.key_data(jax.random.wrap_key_data(x)),
    "random_clone": lambda x: jax.random.key_data(jax.random.clone(jax.random.wrap_key_data(x))),
    "random_seed": lambda s: jax.random.key_data(jax.vmap(jax.random.key)(s)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VANISHING))
def test_decided_identities_leave_one_loop_kernel(name):
    fusion = ops.record(name).fusion.cpu
    assert fusion.loop and fusion.why
    arg = jnp.ones((64,), jnp.int32) if name == "random_seed" else XI.astype(jnp.uint32)[:, :2]
    if name in ("sharding_constraint", "device_put", "optimization_barrier"):
        arg = X
    assert one_loop_kernel(lambda x: VANISHING[name](x * 2) + 1, arg)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reduce_prod", "reduce_and", "reduce_or", "reduce_xor"])
def test_decided_reductions_read_their_input_from_a_buffer(name):
    assert name not in CPU.fusing_readers and ops.record(name).fusion.cpu.why
    reduce = {
        "reduce_prod": lambda x: jnp.prod(x * 2.0 + 1.0, axis=1),
        "reduce_and": lambda x: jnp.all(x * 2.0 > 1.0, axis=1),
        "reduce_or": lambda x: jnp.any(x * 2.0 > 1.0, axis=1),
        "reduce_xor": lambda x: lax.reduce_xor_p.bind((x * 2.0).astype(jnp.int32), axes=(1,)),
    }[name]
    assert name in str(jax.make_jaxpr(reduce)(X))
    first, *rest = kernels(reduce, X)
    assert "kind=kLoop" in first[3] and rest and first[0] in rest[0][2]  # the input, apart


@pytest.mark.slow
def test_the_reductions_the_tables_list_fuse_their_input():
    for reduce in (lambda x: jnp.max(x * 2.0 + 1.0, axis=1), lambda x: jnp.argmax(x * 2.0, axis=1)):
        assert len([k for k in kernels(reduce, X) if k[1] == "fusion"]) == 1
