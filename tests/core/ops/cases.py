"""One small program per primitive, for the golden rule tests: name -> (fn, args)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name

f32 = jnp.float32


def a(*shape, dtype=f32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _constrained(x):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    return lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, jax.P("d")))


def _conv(x, w, **kw):
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), **kw
    )


CASES = {
    # elementwise
    "add": (lambda x, y: x + y, (a(2, 4), a(2, 4))),
    "add_any": (lambda x: jax.grad(lambda z: (z * z).sum())(x), (a(2, 4),)),
    "sub": (lambda x, y: x - y, (a(2, 4), a(2, 4))),
    "mul": (lambda x: x * 2.0, (a(2, 4),)),
    "div": (lambda x, y: x / y, (a(2, 4), a(2, 4))),
    "max": (lambda x, y: jnp.maximum(x, y), (a(2, 4), a(2, 4))),
    "exp": (jnp.exp, (a(2, 4),)),
    "tanh": (jnp.tanh, (a(2, 4),)),
    "integer_pow": (lambda x: x**3, (a(2, 4),)),
    "neg": (lambda x: -x, (a(2, 4),)),
    "convert_element_type": (lambda x: x.astype(jnp.bfloat16), (a(2, 4),)),
    "select_n": (lambda p, x, y: lax.select(p, x, y), (a(2, 4, dtype=bool), a(2, 4), a(2, 4))),
    "stop_gradient": (lax.stop_gradient, (a(2, 4),)),
    "name": (lambda x: checkpoint_name(x, "h"), (a(2, 4),)),
    "sharding_constraint": (_constrained, (a(2, 4),)),
    "gt": (lambda x: x > 0, (a(2, 4),)),
    "rsqrt": (lax.rsqrt, (a(2, 4),)),
    # contractions
    "dot_general": (lambda x, w: x @ w, (a(2, 4), a(4, 8))),
    "dot_general/batched": (
        lambda q, k: jnp.einsum("bqhd,bkhd->bhqk", q, k),
        (a(2, 8, 4, 16), a(2, 8, 4, 16)),
    ),
    "conv_general_dilated": (lambda x, w: _conv(x, w), (a(2, 8, 8, 3), a(3, 3, 3, 16))),
    "conv_general_dilated/1x1": (lambda x, w: _conv(x, w), (a(2, 8, 8, 4), a(1, 1, 4, 16))),
    "conv_general_dilated/depthwise": (
        lambda x, w: _conv(x, w, feature_group_count=4),
        (a(2, 8, 8, 4), a(3, 3, 1, 8)),
    ),
    # reductions
    "reduce_sum": (lambda x: x.sum(axis=1), (a(2, 4, 8),)),
    "reduce_max": (lambda x: x.max(axis=-1), (a(2, 4),)),
    "reduce_min": (lambda x: x.min(axis=0), (a(2, 4),)),
    "argmax": (lambda x: jnp.argmax(x, axis=-1), (a(2, 4),)),
    "cumsum": (lambda x: jnp.cumsum(x, axis=1), (a(2, 4),)),
    "cumprod": (lambda x: jnp.cumprod(x, axis=0), (a(2, 4),)),
    # shape ops
    "broadcast_in_dim": (lambda x: jnp.broadcast_to(x[:, None, :], (2, 3, 4)), (a(2, 4),)),
    "reshape/merge": (lambda x: x.reshape(8, 4), (a(2, 4, 4),)),
    "reshape/split": (lambda x: x.reshape(2, 4, 4), (a(8, 4),)),
    "reshape/mixed": (lambda x: x.reshape(4, 6), (a(6, 4),)),
    "transpose": (lambda x: x.transpose(2, 0, 1), (a(2, 3, 4),)),
    "squeeze": (lambda x: x.squeeze(1), (a(2, 1, 4),)),
    "broadcast_in_dim/expand_dims": (lambda x: jnp.expand_dims(x, 0), (a(2, 4),)),
    "rev": (lambda x: x[::-1], (a(2, 4),)),
    "concatenate": (lambda x, y: jnp.concatenate([x, y], axis=1), (a(2, 4), a(2, 6))),
    "pad": (lambda x: jnp.pad(x, ((0, 0), (1, 2))), (a(2, 4),)),
    "slice": (lambda x: x[:, 1:3], (a(2, 4),)),
    "iota": (lambda: lax.broadcasted_iota(jnp.int32, (4, 8), 1), ()),
    "split": (lambda x: jnp.split(x, 2, axis=1), (a(2, 4),)),
    "tile": (lambda x: jnp.tile(x, (3, 1)), (a(2, 4),)),
    "tile/cls_token": (lambda c: jnp.tile(c, (4, 1, 1)), (a(1, 1, 8),)),
    "le_to": (lambda x, y: lax.le_to_p.bind(x, y), (a(2, 4), a(2, 4))),
    # indexing
    "dynamic_slice": (
        lambda x, i: lax.dynamic_slice_in_dim(x, i, 2, axis=1),
        (a(2, 4), a(dtype=jnp.int32)),
    ),
    "dynamic_update_slice": (
        lambda x, u, i: lax.dynamic_update_slice_in_dim(x, u, i, axis=1),
        (a(2, 4), a(2, 2), a(dtype=jnp.int32)),
    ),
    "gather/embedding": (lambda e, t: e[t], (a(16, 8), a(2, 4, dtype=jnp.int32))),
    "gather/take_along_axis": (
        lambda x, i: jnp.take_along_axis(x, i[:, :, None], axis=-1),
        (a(2, 4, 16), a(2, 4, dtype=jnp.int32)),
    ),
    "scatter-add/embedding_grad": (
        lambda e, t: jax.grad(lambda e: e[t].sum())(e),
        (a(16, 8), a(2, 4, dtype=jnp.int32)),
    ),
    "scatter-add/segment_sum": (
        lambda x, s: jax.ops.segment_sum(x, s, num_segments=8),
        (a(16, 4), a(16, dtype=jnp.int32)),
    ),
    "scatter": (lambda x, i, u: x.at[i].set(u), (a(8, 4), a(3, dtype=jnp.int32), a(3, 4))),
    # sorting and windows
    "sort": (lambda x: jnp.sort(x, axis=-1), (a(2, 4),)),
    "top_k": (lambda x: lax.top_k(x, 2), (a(2, 8),)),
    "reduce_window_sum": (
        lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
        (a(2, 8, 8, 4),),
    ),
    "reduce_window_max": (
        lambda x: lax.reduce_window(x, -np.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
        (a(2, 8, 8, 4),),
    ),
    # control flow
    "scan": (
        lambda c, xs, w: lax.scan(lambda c, x: (jnp.tanh(c @ w + x), c.sum()), c, xs),
        (a(2, 4), a(5, 2, 4), a(4, 4)),
    ),
    "while": (
        lambda x, w: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ w), (0, x)),
        (a(2, 4), a(4, 4)),
    ),
    "cond": (
        lambda p, x: lax.cond(p, lambda y: y + 1.0, lambda y: y * 2.0, x),
        (a(dtype=bool), a(2, 4)),
    ),
}


def mapping_text(cases, key) -> str:
    """The printed factor mapping of the first ``key`` primitive in ``cases[key]``'s program
    (the key's part before ``/`` names the primitive); no rule may fall back to a barrier."""
    import workbench as wb

    fn, args = cases[key]
    primitive = key.split("/")[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program = wb.capture(fn, *args)
        (op, *_) = [op for op in program.ops if op.primitive == primitive]
        return str(program.mapping(op))
