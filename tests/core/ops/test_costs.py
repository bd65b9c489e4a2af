"""op_cost against XLA's own cost analysis, one small function per primitive family.

Each case traces a function, sums op_cost over its equations (`jaxpr_cost`) and compares
with ``jit(f).lower(*args).compile().cost_analysis()`` on CPU: flops and transcendentals
within 2%, bytes within 2% (plus a few bytes for scalars) where both count the same
thing. Where they differ on purpose, the case says why and checks our own figure.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from workbench.core.estimate.compute import op_time
from workbench.core.hardware import CPU, H100
from workbench.core.ops import RULES
from workbench.core.ops.costs import OpCost, is_known, jaxpr_cost, op_cost
from workbench.core.ops.mapping import TensorType

f32 = jnp.float32
X = jnp.linspace(0.1, 0.9, 64 * 128, dtype=f32).reshape(64, 128)
XI = jnp.arange(64 * 128, dtype=jnp.int32).reshape(64, 128)
IMG = jnp.ones((2, 16, 16, 8), f32)
CDN = ("NHWC", "HWIO", "NHWC")
IDX = (jnp.arange(16) * 3 % 64)[:, None]
GDN = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
SDN = lax.ScatterDimensionNumbers(
    update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,)
)


def maxpool_and_grad(s, a):
    """reduce_window_max forward, select_and_scatter_add backward."""
    pool = partial(
        lax.reduce_window,
        init_value=-jnp.inf,
        computation=lax.max,
        window_dimensions=(1, 2, 2, 1),
        window_strides=(1, 2, 2, 1),
        padding="VALID",
    )
    y, pullback = jax.vjp(pool, a)
    return y, pullback(s)[0]


def xla_cost(fn, *args, lowered=False, donate=()):
    lowered_fn = jax.jit(fn, donate_argnums=donate).lower(*args)
    c = lowered_fn.cost_analysis() if lowered else lowered_fn.compile().cost_analysis()
    return OpCost(c.get("flops", 0.0), c.get("transcendentals", 0.0), c.get("bytes accessed", 0.0))


def close(ours, theirs, rtol=0.02, atol=0.0):
    return abs(ours - theirs) <= rtol * abs(theirs) + atol


# (name, fn, args, what to compare, options). "f": flops, "t": transcendentals, "b": bytes.
CASES = [
    ("matmul", lambda a, b: a @ b, (X, X.T[:, :32]), "ftb", {}),
    ("batched dot", lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
     (jnp.ones((4, 16, 32)), jnp.ones((4, 32, 8))), "ftb", {}),
    ("conv same", lambda a, w: lax.conv_general_dilated(a, w, (1, 1), "SAME", dimension_numbers=CDN),
     (IMG, jnp.ones((3, 3, 8, 4))), "ftb", {}),
    ("conv strided", lambda a, w: lax.conv_general_dilated(a, w, (2, 2), "SAME", dimension_numbers=CDN),
     (IMG, jnp.ones((3, 3, 8, 4))), "ft", {}),
    ("conv grouped", lambda a, w: lax.conv_general_dilated(
        a, w, (1, 1), "SAME", dimension_numbers=CDN, feature_group_count=4),
     (IMG, jnp.ones((3, 3, 2, 8))), "ft", {}),
    ("conv rhs dilated", lambda a, w: lax.conv_general_dilated(
        a, w, (1, 1), "VALID", rhs_dilation=(2, 2), dimension_numbers=CDN),
     (IMG, jnp.ones((3, 3, 8, 4))), "ft", {}),
    ("conv lhs dilated", lambda a, w: lax.conv_general_dilated(
        a, w, (1, 1), ((1, 1), (1, 1)), lhs_dilation=(2, 2), dimension_numbers=CDN),
     (IMG, jnp.ones((3, 3, 8, 4))), "ft", {}),
    ("add", lax.add, (X, X), "ftb", {}),
    ("mul literal", lambda a: a * 2.0, (X,), "ftb", {}),
    ("div", lax.div, (X, X), "ftb", {}),
    ("max", lax.max, (X, X), "ftb", {}),
    ("neg", lax.neg, (X,), "ftb", {}),
    ("compare", lax.lt, (X, X), "ftb", {}),
    ("convert", lambda a: a.astype(jnp.int32), (X,), "ftb", {}),
    ("select_n 2", lambda p, a, b: lax.select_n(p, a, b), (X > 0.5, X, X), "ftb", {}),
    ("select_n 4", lambda p, a, b, c, d: lax.select_n(p, a, b, c, d), (XI % 4, X, X, X, X), "ft", {}),
    ("clamp", lambda a: lax.clamp(0.2, a, 0.5), (X,), "ftb", {}),
    ("bitwise", lax.bitwise_xor, (XI, XI), "ftb", {}),
    ("exp", lax.exp, (X,), "ftb", {}),
    ("tanh", lax.tanh, (X,), "ftb", {}),
    ("log", lax.log, (X,), "ftb", {}),
    ("rsqrt", lax.rsqrt, (X,), "ftb", {}),
    ("pow", lax.pow, (X, X), "ftb", {}),
    ("atan2", lax.atan2, (X, X), "ftb", {}),
    ("logistic", lax.logistic, (X,), "ft", {}),
    ("erf_inv", lax.erf_inv, (X,), "ft", {}),
    ("lgamma", lax.lgamma, (X + 1,), "ft", {}),
    ("acos", lax.acos, (X,), "ft", {}),
    ("asinh", lax.asinh, (X,), "ft", {}),
    ("erfc", lax.erfc, (X,), "ft", {}),
    ("sinh", lax.sinh, (X,), "ft", {}),
    ("integer_pow 2", lambda a: lax.integer_pow(a, 2), (X,), "ft", {}),
    ("integer_pow 7", lambda a: lax.integer_pow(a, 7), (X,), "ft", {}),
    ("integer_pow -2", lambda a: lax.integer_pow(a, -2), (X,), "ft", {}),
    ("reduce_sum", lambda a: a.sum(1), (X,), "ftb", {}),
    ("reduce_max all", lambda a: a.max(), (X,), "ftb", {}),
    ("reduce_prod", lambda a: lax.reduce_prod_p.bind(a, axes=(0,), out_sharding=None), (X,), "ft", {}),
    ("argmax float", lambda a: lax.argmax(a, 1, jnp.int32), (X,), "ft", {}),
    ("argmin int", lambda a: lax.argmin(a, 0, jnp.int32), (XI,), "ft", {}),
    ("reduce_window sum", lambda a: lax.reduce_window(a, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"),
     (IMG,), "ftb", {}),
    ("reduce_window max", lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
     (IMG,), "ftb", {}),
    ("sort", lambda a: lax.sort(a, dimension=1), (X,), "ftb", {}),
    ("sort two operands", lambda a, b: lax.sort((a, b), dimension=0, num_keys=1), (X, XI), "ftb", {}),
    ("fft", jnp.fft.fft, (X.astype(jnp.complex64),), "ftb", {}),
    ("transpose", lambda a: lax.transpose(a, (1, 0)), (X,), "ftb", {}),
    ("broadcast", lambda a: lax.broadcast_in_dim(a, (4, 64, 128), (1, 2)), (X,), "ftb", {}),
    ("concatenate", lambda a, b: lax.concatenate([a, b], 1), (X, X), "ftb", {}),
    ("pad", lambda a: lax.pad(a, 0.0, ((1, -2, 1), (0, 3, 0))), (X,), "ftb", {}),
    ("rev", lambda a: lax.rev(a, (0,)), (X,), "ftb", {}),
    ("strided slice", lambda a: lax.slice(a, (0, 0), (32, 128), (2, 1)), (X,), "ftb", {}),
    ("iota", lambda: lax.iota(f32, 1000), (), "ftb", {}),
    ("dynamic_slice", lambda a, i: lax.dynamic_slice(a, (i, 0), (8, 128)), (X, 3), "b", {}),
    ("dynamic_update_slice in place", lambda a, u, i: lax.dynamic_update_slice(a, u, (i, 0)),
     (X, jnp.ones((8, 128)), 3), "b", {"donate": (0,)}),
    # compiled XLA:CPU fuses the gather/scatter and charges the whole operand; the HLO
    # convention (what XLA says about the op itself) reads only what is gathered.
    ("gather", lambda a, i: lax.gather(a, i, GDN, (1, 128), mode="promise_in_bounds"),
     (X, IDX), "ftb", {"lowered": True}),
    ("scatter-add", lambda a, i, u: lax.scatter_add(a, i, u, SDN, mode="promise_in_bounds"),
     (X, IDX, jnp.ones((16, 128))), "ftb", {"lowered": True}),
    ("scatter", lambda a, i, u: lax.scatter(a, i, u, SDN, mode="promise_in_bounds"),
     (X, IDX, jnp.ones((16, 128))), "ftb", {"lowered": True}),
    # XLA:CPU rewrites select-and-scatter into other ops; the HLO op's own count matches.
    ("max pool and its grad", lambda s, a: maxpool_and_grad(s, a),
     (jnp.ones((2, 8, 8, 8)), IMG), "ft", {"lowered": True}),
    ("mlp", lambda w1, w2, x: jnp.tanh(x @ w1).sum(-1) @ w2, (X.T, X[:64, :64], X), "ft", {}),
    ("mlp grad", jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)), (X.T[:, :32], X), "ft", {}),
]  # fmt: skip


@pytest.mark.parametrize("name,fn,args,what,opts", CASES, ids=[c[0] for c in CASES])
def test_matches_xla(name, fn, args, what, opts):
    ours = jaxpr_cost(jax.make_jaxpr(fn)(*args))
    theirs = xla_cost(fn, *args, **opts)
    # a few scalar ops (index clamping) may differ by a handful of flops
    if "f" in what:
        assert close(ours.flops, theirs.flops, atol=8), (ours, theirs)
    if "t" in what:
        assert close(ours.transcendentals, theirs.transcendentals), (ours, theirs)
    if "b" in what:
        assert close(ours.bytes_accessed, theirs.bytes_accessed, atol=64), (ours, theirs)


def test_cumulative_ops_count_a_work_efficient_scan():
    # JAX lowers cumsum to an O(n^2) reduce-window; XLA rewrites it per backend
    # (XLA:CPU: ~17 flops per element here). We count n - 1 adds per line.
    ours = jaxpr_cost(jax.make_jaxpr(lambda a: lax.cumsum(a, 1))(X))
    assert ours.flops == 64 * 127
    assert ours.bytes_accessed == 2 * X.nbytes
    lowered = xla_cost(lambda a: lax.cumsum(a, 1), X, lowered=True)
    assert lowered.flops == 64 * 128 * 127  # the quadratic reduce-window, before XLA rewrites it
    assert xla_cost(lambda a: lax.cumsum(a, 1), X).flops > ours.flops
    lse = jaxpr_cost(jax.make_jaxpr(lambda a: lax.cumlogsumexp(a, 0))(X))
    assert (lse.flops, lse.transcendentals) == (8 * 63 * 128, 2 * 63 * 128)
    # per combine, our logaddexp cost is XLA's (from the unrewritten reduce-window)
    unrewritten = xla_cost(lambda a: lax.cumlogsumexp(a, 0), X, lowered=True)
    assert (
        unrewritten.flops / (128 * 64 * 63) == 8
        and unrewritten.transcendentals / (128 * 64 * 63) == 2
    )


def test_dot_without_contraction_counts_two_flops_per_element():
    # XLA:CPU rewrites an outer product into a multiply (1 flop per element); the HLO
    # dot (and every accelerator matmul unit) costs 2.
    fn = lambda a, b: lax.dot_general(a, b, (((), ()), ((), ())))  # noqa: E731
    a, b = jnp.ones((16,)), jnp.ones((8,))
    ours = jaxpr_cost(jax.make_jaxpr(fn)(a, b))
    assert ours.flops == 2 * 16 * 8 == xla_cost(fn, a, b, lowered=True).flops
    assert xla_cost(fn, a, b).flops == 16 * 8


def test_random_bits_count_every_round():
    # XLA counts the rolled threefry round loop once; we count its 20 rounds. Partitionable
    # threefry (the default) hashes one (key, index) pair per element, then xors the pair.
    key = jax.random.key(0)
    ours = jaxpr_cost(jax.make_jaxpr(lambda k: jax.random.bits(k, (4096,)))(key))
    assert ours.flops == (120 + 1) * 4096
    with jax.threefry_partitionable(False):  # one pair per two 32-bit words
        assert jaxpr_cost(jax.make_jaxpr(lambda k: jax.random.bits(k, (4096,)))(key)).flops == (
            120 * 4096 / 2
        )
    assert xla_cost(lambda k: jax.random.bits(k, (4096,)), key).flops < ours.flops


def test_top_k_is_a_partial_sort():
    ours = jaxpr_cost(jax.make_jaxpr(lambda a: lax.top_k(a, 4))(X))
    assert ours.flops == X.size * 3  # ceil(log2(4 + 1))
    assert xla_cost(lambda a: lax.top_k(a, 4), X).flops == -1  # a custom call on CPU


def test_scan_body_counts_length_times_and_cond_its_dearest_branch():
    w = jnp.ones((32, 32))

    def loop(x):
        return lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=5)[0]

    one = jaxpr_cost(jax.make_jaxpr(lambda x: jnp.tanh(x @ w))(jnp.ones((4, 32))))
    assert jaxpr_cost(jax.make_jaxpr(loop)(jnp.ones((4, 32)))).flops == 5 * one.flops

    def branch(p, x):
        return lax.cond(p, lambda y: y @ w, lambda y: y + 1.0, x)

    cost = jaxpr_cost(jax.make_jaxpr(branch)(True, jnp.ones((4, 32))))
    assert cost.flops == 2 * 4 * 32 * 32 + 1  # the dearer branch, and converting the predicate


def test_unknown_primitive_default_and_literals():
    a, b = TensorType((8, 16), np.float32), TensorType((4,), jnp.bfloat16)
    assert op_cost("mystery_op", {}, [a, b], [a]) == OpCost(0.0, 0.0, 2 * 512 + 8)
    assert not is_known("mystery_op")
    literal = TensorType((), np.float32, literal=2.0)
    assert op_cost("mul", {}, [a, literal], [a]) == OpCost(128, 0, 512 + 4 + 512)
    key = TensorType((), jax.random.key(0).dtype)
    assert op_cost("random_unwrap", {}, [key], [TensorType((2,), np.uint32)]).bytes_accessed == 16


def test_every_primitive_with_a_sharding_rule_has_a_cost_rule():
    missing = sorted(p for p in RULES if not is_known(p))
    assert not missing, f"no cost rule for {missing}"


def test_op_cost_adds_and_scales():
    c = OpCost(1, 2, 3)
    assert c + c == OpCost(2, 4, 6) == 2 * c == c * 2


def test_roofline():
    matmul = op_cost(
        "dot_general",
        {"dimension_numbers": (((1,), (0,)), ((), ()))},
        [TensorType((4096, 4096), jnp.bfloat16)] * 2,
        [TensorType((4096, 4096), jnp.bfloat16)],
    )
    assert matmul.flops == 2 * 4096**3
    assert op_time(matmul, H100, jnp.bfloat16) == pytest.approx(2 * 4096**3 / 989.5e12)
    add = op_cost(
        "add", {}, [TensorType((1 << 20,), np.float32)] * 2, [TensorType((1 << 20,), np.float32)]
    )
    assert op_time(add, H100, "float32") == pytest.approx(12 * (1 << 20) / 3.35e12)
    exp = op_cost("exp", {}, [TensorType((10,), np.float32)], [TensorType((10,), np.float32)])
    assert exp == OpCost(0, 10, 80)
    assert op_time(OpCost(1e10, 0, 0), CPU) == pytest.approx(1e10 / CPU.peak_flops("float32"))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dtype_sizes_follow_the_operands(dtype):
    a = jnp.ones((64, 64), dtype)
    cost = jaxpr_cost(jax.make_jaxpr(partial(jnp.matmul))(a, a))
    assert cost.bytes_accessed == 3 * a.nbytes
