"""Golden tests for the random family (typed keys, bits) and bitcasts, like test_golden.py.

What may be split depends on the key's implementation: threefry keys split per key, and
(partitionable) their generated bits too; rbg keys are blocked everywhere.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry2x32_p

from tests.core.ops.cases import mapping_text as golden_text
from workbench.core.ops import mapping_for
from workbench.core.ops.costs import op_cost
from workbench.core.ops.mapping import TensorType

FRY = jax.random.key(0).dtype
RBG = jax.random.key(0, impl="rbg").dtype
U32 = jnp.uint32


def a(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def each(fn):
    return lambda k: jax.vmap(fn)(k)


CASES = {
    "random_seed": (jax.random.key, (a(dtype=jnp.int32),)),
    "random_seed/batched": (jax.vmap(jax.random.key), (a(8, dtype=jnp.int32),)),
    "random_wrap": (jax.random.wrap_key_data, (a(8, 2, dtype=U32),)),
    "random_unwrap": (jax.random.key_data, (a(8, dtype=FRY),)),
    "random_clone": (jax.random.clone, (a(8, dtype=FRY),)),
    "random_split": (lambda k: jax.random.split(k, 4), (a(dtype=FRY),)),
    "random_split/batched": (each(lambda k: jax.random.split(k, 4)), (a(8, dtype=FRY),)),
    "random_split/rbg": (each(lambda k: jax.random.split(k, 4)), (a(8, dtype=RBG),)),
    "random_fold_in": (jax.vmap(jax.random.fold_in), (a(8, dtype=FRY), a(8, dtype=U32))),
    "random_fold_in/rbg": (each(lambda k: jax.random.fold_in(k, 3)), (a(8, dtype=RBG),)),
    "random_bits": (lambda k: jax.random.bits(k, (4, 16)), (a(dtype=FRY),)),
    "random_bits/batched": (each(lambda k: jax.random.bits(k, (16,))), (a(8, dtype=FRY),)),
    "random_bits/rbg": (each(lambda k: jax.random.bits(k, (16,))), (a(8, dtype=RBG),)),
    "threefry2x32": (
        lambda *xs: threefry2x32_p.bind(*xs),
        tuple(a(4, 8, dtype=U32) for _ in "1234"),
    ),
    "rng_bit_generator": (lambda k: jax.lax.rng_bit_generator(k, (4, 8)), (a(4, dtype=U32),)),
    "bitcast_convert_type": (lambda x: jax.lax.bitcast_convert_type(x, jnp.int32), (a(2, 4),)),
    "bitcast_convert_type/narrower": (
        lambda x: jax.lax.bitcast_convert_type(x, jnp.uint8),
        (a(2, 4),),
    ),
    "bitcast_convert_type/wider": (
        lambda x: jax.lax.bitcast_convert_type(x, jnp.float32),
        (a(2, 4, 4, dtype=jnp.uint8),),
    ),
}

GOLDEN = {
    "random_seed": "([])->([])",
    "random_seed/batched": "([i])->([i]) {i=8}",
    "random_wrap": "([i, j])->([i]) {i=8, j=2} blocked: j structural",
    "random_unwrap": "([i])->([i, j]) {i=8, j=2} blocked: j structural",
    "random_clone": "([i])->([i]) {i=8}",
    "random_split": "([])->([i]) {i=4} blocked: i",
    "random_split/batched": "([i])->([i, j]) {i=8, j=4} blocked: j",
    "random_split/rbg": "([i])->([j, k]) {i=8, j=8, k=4} blocked: i, j, k",
    "random_fold_in": "([i], [i])->([i]) {i=8}",
    "random_fold_in/rbg": "([i], [])->([j]) {i=8, j=8} blocked: i, j",
    "random_bits": "([])->([i, j]) {i=4, j=16}",
    "random_bits/batched": "([i])->([i, j]) {i=8, j=16}",
    "random_bits/rbg": "([i])->([j, k]) {i=8, j=8, k=16} blocked: i, j, k",
    "threefry2x32": "([i, j], [i, j], [i, j], [i, j])->([i, j], [i, j]) {i=4, j=8}",
    "rng_bit_generator": "([i])->([j], [k, l]) {i=4, j=4, k=4, l=8} blocked: i, j, k, l",
    "bitcast_convert_type": "([i, j])->([i, j]) {i=2, j=4}",
    "bitcast_convert_type/narrower": "([i, j])->([i, j, k]) {i=2, j=4, k=4} blocked: k",
    "bitcast_convert_type/wider": "([i, j, k])->([i, j]) {i=2, j=4, k=4} blocked: k",
}


def mapping_text(key):
    return golden_text(CASES, key)


def test_every_case_has_a_golden_text():
    assert set(CASES) == set(GOLDEN)


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_rule(key):
    assert mapping_text(key) == GOLDEN[key]


def test_threefry_bits_are_blocked_unless_partitionable():
    with jax.threefry_partitionable(False):
        assert mapping_text("random_bits") == "([])->([i, j]) {i=4, j=16} blocked: i, j"
        assert mapping_text("random_bits/batched") == "([i])->([i, j]) {i=8, j=16} blocked: j"


def test_key_dtypes_are_priced_by_their_words():
    fry, rbg = TensorType((8,), FRY), TensorType((8,), RBG)
    words = TensorType((8, 2), np.uint32)
    assert op_cost("random_unwrap", {}, [fry], [words]).bytes_accessed == 2 * 64
    assert op_cost("random_split", {"shape": (2,)}, [rbg], [TensorType((8, 2), RBG)]).flops > 0
    bits = TensorType((8, 16), np.uint32)
    threefry = op_cost("random_bits", {"bit_width": 32, "shape": (16,)}, [fry], [bits])
    assert threefry.flops == 121 * 8 * 16 and threefry.bytes_accessed == 64 + 512
    rng = op_cost("random_bits", {"bit_width": 32, "shape": (16,)}, [rbg], [bits])
    assert rng.transcendentals == 8 * 16 and rng.bytes_accessed == 128 + 512


def test_unknown_primitive_on_keys_is_a_barrier():
    keys = TensorType((8,), FRY)
    with pytest.warns(UserWarning, match="no sharding rule for primitive 'key_riddle'"):
        mapping = mapping_for("key_riddle", {}, [keys], [keys])
    assert mapping.barrier and str(mapping) == "([i])->([j]) {i=8, j=8} blocked: i, j barrier"
