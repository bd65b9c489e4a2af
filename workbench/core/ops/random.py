"""Random keys and bits (``jax.random``): rules, costs and per-device lowerings.

A typed key array ``key<impl>[S]`` holds one key per element of ``S`` (see ``ir/dtypes``).
What may be split depends on the key's implementation:

- *threefry2x32* is exact per key (``vmap`` over keys equals a loop), so the key dimensions
  ``S`` may be tiled everywhere. With ``jax_threefry_partitionable`` (the default) its bits
  are a counter-based function of (key, global index), so ``random_bits``' generated
  dimensions may be tiled too: each device computes only its block, from its offsets
  (`_bits_local`), and gets the bits the unpartitioned program gets.
- *rbg* and *unsafe_rbg* draw from XLA's ``RngBitGenerator``: the bits of an array (even of
  a batch of keys) depend on the whole array's shape, so every factor is blocked. Each
  device generates the whole array and keeps its block, which is what XLA's SPMD
  partitioner does too (unless ``--xla_tpu_spmd_rng_bit_generator_unsafe``): the bits equal
  the unpartitioned program's, at the price of generating all of them everywhere.

New key dimensions made by ``random_split`` are blocked (keys are tiny); the word dimension
of ``random_wrap`` / ``random_unwrap`` (2 uint32 for threefry, 4 for rbg) is blocked.
"""

from __future__ import annotations

import math
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import threefry2x32_p

from workbench.core.dtypes import impl_name
from workbench.core.ops.costs import OpCost, io_bytes
from workbench.core.ops.elementwise import CHEAP, VANISHES, pointwise
from workbench.core.ops.local import offset
from workbench.core.ops.mapping import MappingBuilder, TensorType
from workbench.core.ops.record import KERNEL, Barrier, Traits
from workbench.core.ops.registry import register

THREEFRY = "threefry2x32"
#: 20 rounds x (add, rotate = 3, xor) + key injections, per pair of 32-bit words
THREEFRY_PER_PAIR = 120


def partitionable() -> bool:
    """Whether threefry bits are counter-based (``jax_threefry_partitionable``)."""
    return bool(jax.config.jax_threefry_partitionable)


def exact_per_key(t: TensorType) -> bool:
    """Whether an op on a key array computes each key on its own (threefry only)."""
    return impl_name(t.dtype) == THREEFRY


def _blocked(operands, results):
    b = MappingBuilder()
    for t in operands:
        b.operand(b.dims_for(t.shape, blocked=True))
    for t in results:
        b.result(b.dims_for(t.shape, blocked=True))
    return b.build()


#: Draws on keys: an input read only by these ops is a key (``anatomy``).
_DRAWS = Traits(random=True)
#: XLA:CPU rolls threefry's rounds into a while loop: kernels of their own
_ROUNDS = replace(
    KERNEL, why="not in the simulator's tables before; XLA:CPU runs threefry's rounds in a loop"
)


# -- costs (local types) ---------------------------------------------------------------------
def _cost(flops, operands, results, transcendentals=0.0):
    return OpCost(float(flops), float(transcendentals), io_bytes(operands, results))


def _move_cost(params, operands, results):
    return _cost(0, operands, results)


def _key_cost(params, operands, results):
    """Split and fold-in: one threefry per pair of words of each key made."""
    words = math.prod(results[0].shape) * results[0].dtype.itemsize // 4
    return _cost(THREEFRY_PER_PAIR * max(words // 2, 1), operands, results)


def _bits_cost(params, operands, results):
    (out,) = results
    n = math.prod(out.shape)
    if not exact_per_key(operands[0]):  # RngBitGenerator: XLA counts one per element
        return _cost(0, operands, results, transcendentals=n)
    if partitionable():  # one threefry pair per element, then an xor
        return _cost((THREEFRY_PER_PAIR + 1) * n, operands, results)
    words = -(-n * params["bit_width"] // 32)
    return _cost(THREEFRY_PER_PAIR * -(-words // 2), operands, results)


def _threefry_cost(params, operands, results):
    return _cost(THREEFRY_PER_PAIR * math.prod(results[0].shape), operands, results)


def _rng_cost(params, operands, results):
    return _cost(0, operands, results, transcendentals=sum(math.prod(r.shape) for r in results))


# -- rules -----------------------------------------------------------------------------------
@register("random_seed", cost=_move_cost, fusion=CHEAP, traits=_DRAWS)
@register("random_clone", cost=_move_cost, fusion=VANISHES)
def _seed_rule(params, operands, results):
    return pointwise(operands, results)


def _words(b: MappingBuilder, keys: TensorType, words: TensorType):
    """Factors of a key array and of its words: shared leading dims, blocked word dims."""
    lead = b.dims_for(keys.shape)
    return lead, [*lead, *b.dims_for(words.shape[keys.rank :], blocked=True)]


@register("random_wrap", cost=_move_cost, fusion=VANISHES, traits=_DRAWS)
def _wrap_rule(params, operands, results):
    b = MappingBuilder()
    keys, words = _words(b, results[0], operands[0])
    b.operand(words)
    b.result(keys)
    return b.build(structural=True)


@register("random_unwrap", cost=_move_cost, fusion=VANISHES)
def _unwrap_rule(params, operands, results):
    b = MappingBuilder()
    keys, words = _words(b, operands[0], results[0])
    b.operand(keys)
    b.result(words)
    return b.build(structural=True)


@register("random_split", cost=_key_cost, fusion=_ROUNDS, traits=_DRAWS)
def _split_rule(params, operands, results):
    (keys,), (out,) = operands, results
    if not exact_per_key(keys):
        return _blocked(operands, results)
    b = MappingBuilder()
    lead = b.dims_for(keys.shape)
    b.operand(lead)
    b.result([*lead, *b.dims_for(out.shape[keys.rank :], blocked=True)])
    return b.build()


@register("random_fold_in", cost=_key_cost, fusion=_ROUNDS, traits=_DRAWS)
def _fold_in_rule(params, operands, results):
    if not exact_per_key(operands[0]):
        return _blocked(operands, results)
    return pointwise(operands, results)


def _bits_tileable(keys: TensorType, out: TensorType) -> bool:
    """Whether the generated dimensions of ``random_bits`` may be tiled (see `_bits_local`)."""
    return exact_per_key(keys) and partitionable() and math.prod(out.shape[keys.rank :]) < 2**32


def _bits_local(op, args, ins, outs, mesh):
    """``random_bits`` on this device's block: threefry of (key, global index) where the
    generated dimensions are tiled, exactly as JAX's partitionable threefry computes it."""
    (keys,), layout = args, outs[0]
    nk, shape, width = keys.ndim, tuple(op.params["shape"]), op.params["bit_width"]
    if not any(layout.dims[nk:]):
        return [op.jax_primitive.bind(keys, **op.params)]
    local = layout.local_shape(mesh)[nk:]
    index = jnp.zeros(local, np.uint32)
    for d in range(len(shape)):
        stride = np.uint32(math.prod(shape[d + 1 :]))
        start = lax.convert_element_type(offset(layout, nk + d, mesh), np.uint32)
        index = index + (lax.broadcasted_iota(np.uint32, local, d) + start) * stride
    high = jnp.zeros(local, np.uint32)  # the index's upper word: the array is < 2**32

    def one(words):
        k1, k2 = jnp.broadcast_to(words[0], local), jnp.broadcast_to(words[1], local)
        b1, b2 = threefry2x32_p.bind(k1, k2, high, index)
        if width == 64:
            dtype = np.dtype("uint64")
            return (b1.astype(dtype) << dtype.type(32)) | b2.astype(dtype)
        return (b1 ^ b2).astype(np.dtype(f"uint{width}"))

    fn = one
    for _ in range(nk):
        fn = jax.vmap(fn)
    return [fn(jax.random.key_data(keys))]


@register(
    "random_bits",
    cost=_bits_cost,
    fusion=_ROUNDS,
    local=_bits_local,
    traits=Traits(random=True, bitwise=True),
)
def _bits_rule(params, operands, results):
    (keys,), (out,) = operands, results
    if not exact_per_key(keys):
        return _blocked(operands, results)
    b = MappingBuilder()
    lead = b.dims_for(keys.shape)
    b.operand(lead)
    gen = b.dims_for(out.shape[keys.rank :], blocked=not _bits_tileable(keys, out))
    b.result([*lead, *gen])
    return b.build()


@register(
    "threefry2x32",
    cost=_threefry_cost,
    fusion=_ROUNDS,
    traits=Traits(random=True, bitwise=True),
)
def _threefry_rule(params, operands, results):
    return pointwise(operands, results)


@register("rng_bit_generator", cost=_rng_cost, fusion=KERNEL)
def _rng_bit_generator_rule(params, operands, results):
    return _blocked(operands, results)


register("rng_uniform", cost=_rng_cost, fusion=KERNEL)(
    Barrier("XLA's RngUniform: its values depend on the whole array and the backend")
)


# -- what a run can promise --------------------------------------------------------------------
RANDOM_OPS = ("random_bits", "random_split", "random_fold_in", "rng_bit_generator")


def sharding_notes(program, matches: bool = True) -> tuple[str, ...]:
    """What holds for ``program``'s random bits under sharding, for a run's verdict."""
    impls = set()
    for op in program.ops:
        if op.primitive in RANDOM_OPS and op.operands:
            t = program.operand_type(op.operands[0])
            impls.add(impl_name(t.dtype) or op.primitive)
    notes = []
    rbg = sorted(impls - {THREEFRY})
    if rbg:
        notes.append(
            f"random bits from {', '.join(rbg)} draw on XLA's RngBitGenerator, which takes no "
            "offset: the bits of an array depend on the whole array (and differ between CPU, "
            "GPU and TPU). The workbench, like XLA's partitioner, generates them whole on "
            "every device and keeps each block, so they equal the unpartitioned step's; the "
            "estimate prices that whole generation per device."
            + (
                ""
                if matches
                else " Outputs that differ here may come from generation split across devices "
                "(XLA_FLAGS=--xla_tpu_spmd_rng_bit_generator_unsafe=1): rbg bits then depend "
                "on the sharding. threefry keys give the same bits under any sharding."
            )
        )
    if THREEFRY in impls and not partitionable():
        notes.append(
            "jax_threefry_partitionable is off: threefry bits are generated whole on every "
            "device (the same bits, not split). Turn it on to split their generation."
        )
    return tuple(notes)
