"""Rates by dtype: the name of a dtype, and the fallbacks a spec's tables follow for a dtype
they do not list (peak FLOP/s, a matmul's achievable share of it)."""

from __future__ import annotations

import jax.numpy as jnp

from workbench.core.hardware.levels import HardwareError

# -- dtypes -------------------------------------------------------------------------------------
# Where a dtype's peak rate comes from when a spec does not list it (before float32, bfloat16).
FALLBACKS: dict[str, tuple[str, ...]] = {
    "float32": ("bfloat16",),
    "float16": ("bfloat16",),
    "bfloat16": ("float16",),
    "int8": ("bfloat16",),
    "uint8": ("int8", "bfloat16"),
    "int4": ("int8", "bfloat16"),
    "uint4": ("int8", "bfloat16"),
}


def dtype_name(dtype) -> str:
    """``jnp.bfloat16``, ``np.dtype("float32")`` or ``"int8"`` -> its numpy name."""
    try:
        return jnp.dtype(dtype).name
    except TypeError as e:
        raise HardwareError(
            f"{dtype!r} is not a dtype; give a numpy/JAX dtype or its name, "
            "e.g. 'float32', 'bfloat16', 'int8'."
        ) from e


def fallback_chain(name: str) -> list[str]:
    """``name``, then the dtypes whose rate it falls back to, in order (see `FALLBACKS`)."""
    chain = [name]
    specific = FALLBACKS.get(name)
    if specific is None and name.startswith("float8"):
        specific = ("bfloat16", "float16")
    for c in (*(specific or ()), "float32", "bfloat16"):
        if c not in chain:
            chain.append(c)
    return chain


def looked_up(table, dtype, default=None):
    """``table``'s entry for ``dtype`` or the first of its fallbacks it lists; else
    ``default``."""
    for candidate in fallback_chain(dtype_name(dtype)):
        if candidate in table:
            return table[candidate]
    return default
