"""Dtypes of program values, JAX's extended dtypes included.

A typed PRNG key (``jax.random.key``) has an *extended* dtype such as ``key<fry>``: an
array of shape ``()`` is one key, held underneath as ``key_shape`` machine words (two
uint32 for threefry, four for rbg). ``np.dtype`` cannot represent it, so values keep
JAX's dtype object; its ``itemsize`` is the bytes of one key, so ``elements x itemsize``
prices it like any other array.
"""

from __future__ import annotations

import jax
import numpy as np


def is_extended(dtype) -> bool:
    """True for JAX's extended dtypes (typed PRNG keys)."""
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def epsilon(dtype) -> float:
    """Machine epsilon of a float or complex dtype (or its name); 0 for integers, booleans,
    keys and None."""
    if dtype is None or is_extended(dtype):
        return 0.0
    try:
        return float(np.finfo(np.dtype(dtype)).eps)
    except (TypeError, ValueError):
        import ml_dtypes

        try:
            return float(ml_dtypes.finfo(dtype).eps)
        except (TypeError, ValueError):
            return 0.0


def inexact(dtype) -> bool:
    """True for float and complex dtypes (not keys, not None)."""
    return dtype is not None and not is_extended(dtype) and jax.dtypes.issubdtype(dtype, np.inexact)


def as_dtype(dtype):
    """``np.dtype(dtype)``, or the dtype itself when it is an extended one."""
    return dtype if is_extended(dtype) else np.dtype(dtype)


def itemsize(dtype) -> int:
    """Bytes per element (per key for a key dtype); 4 when the dtype is unknown (None)."""
    return 4 if dtype is None else int(as_dtype(dtype).itemsize)


def key_data(x):
    """The machine words under a typed key array; any other array unchanged."""
    return jax.random.key_data(x) if is_extended(getattr(x, "dtype", None)) else x


def impl_name(dtype) -> str | None:
    """The PRNG implementation of a key dtype (``"threefry2x32"``, ``"rbg"``, ...), else None."""
    if not is_extended(dtype):
        return None
    impl = getattr(dtype, "_impl", None)
    return getattr(impl, "name", None) or str(dtype)


def words(shape, dtype) -> jax.ShapeDtypeStruct:
    """The machine words under an array of ``shape`` and ``dtype`` (itself if not a key)."""
    if not is_extended(dtype):
        return jax.ShapeDtypeStruct(tuple(shape), dtype)
    return jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(tuple(shape), dtype))
