"""Structural keys: names for a program's values that depend on what computes them, not on
where a line sits in the source.

A value's key digests its primitive, its parameters and its operands' keys (inputs by their
position in the flattened arguments, literals and constants by their contents, a tag by its
name). Reordering independent lines, renaming locals, or moving code into a helper function
(calls are entered, as capture enters them) leave every key as it was; changing what is
computed changes the keys downstream of the change. Equal computations get equal keys, told
apart by an occurrence count in program order.

The exported plain-JAX module carries the source of ``structural_keys`` (``SOURCE``) and
places its sharding constraints by these keys, so an export survives such edits of the
model. Only jax, numpy and hashlib are used here, so the source runs on its own.
"""

from __future__ import annotations

import hashlib
import inspect

import numpy as np


def structural_keys(closed, calls):
    """Per top-level equation of ``closed`` (a ClosedJaxpr), in program order with calls
    (``calls``: primitive name -> parameter holding the callee) entered, the keys of its
    results."""
    from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

    def digest(*parts):
        return hashlib.blake2b("|".join(parts).encode(), digest_size=10).hexdigest()

    def array_key(x):
        a = np.asarray(x)
        return digest("const", str(a.shape), str(a.dtype), hashlib.blake2b(a.tobytes()).hexdigest())

    def param_key(value):
        if isinstance(value, ClosedJaxpr):
            return jaxpr_key(value.jaxpr, [array_key(c) for c in value.consts])
        if isinstance(value, Jaxpr):
            return jaxpr_key(value, [f"constvar{i}" for i in range(len(value.constvars))])
        if isinstance(value, tuple | list):
            return "(" + ",".join(param_key(v) for v in value) + ")"
        if isinstance(value, dict):
            return "{" + ",".join(f"{k}:{param_key(v)}" for k, v in sorted(value.items())) + "}"
        if value is None or isinstance(value, bool | int | float | str | np.dtype | np.generic):
            return repr(value)
        if hasattr(value, "dtype") and hasattr(value, "itemsize"):  # jax's extended dtypes
            return str(value)
        return type(value).__name__

    def walk(jaxpr, env, top):
        def read(v):
            if isinstance(v, Literal):
                return digest(
                    "literal", str(np.asarray(v.val).dtype), repr(np.asarray(v.val).tolist())
                )
            return env[v]

        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            operands = [read(v) for v in eqn.invars]
            callee = eqn.params.get(calls.get(name, ""), None)
            if callee is not None:
                inner = getattr(callee, "jaxpr", callee)
                consts = getattr(callee, "consts", ())
                env.update(zip(inner.constvars, [array_key(c) for c in consts]))
                env.update(zip(inner.invars, operands))
                walk(inner, env, top)
                env.update(zip(eqn.outvars, [read(v) for v in inner.outvars]))
                continue
            if name == "name":  # a tag: its name is the key, whatever made the value
                keys = [digest("tag", str(eqn.params.get("name")))]
            else:
                params = ",".join(
                    f"{k}={param_key(v)}" for k, v in sorted(eqn.params.items()) if k != "name"
                )
                base = digest(name, params, *operands)
                keys = [digest(base, str(j)) for j in range(len(eqn.outvars))]
            env.update(zip(eqn.outvars, keys))
            if top is not None:
                top.append(keys)

    def jaxpr_key(jaxpr, const_keys):
        env = dict(zip(jaxpr.constvars, const_keys))
        env.update((v, f"arg{i}") for i, v in enumerate(jaxpr.invars))
        walk(jaxpr, env, None)
        return digest(
            "jaxpr", *[env[v] if not isinstance(v, Literal) else repr(v.val) for v in jaxpr.outvars]
        )

    env = {v: array_key(c) for v, c in zip(closed.jaxpr.constvars, closed.consts)}
    env.update((v, f"input{i}") for i, v in enumerate(closed.jaxpr.invars))
    top = []
    walk(closed.jaxpr, env, top)
    seen = {}
    out = []
    for keys in top:
        numbered = []
        for key in keys:
            seen[key] = seen.get(key, -1) + 1
            numbered.append(f"{key}#{seen[key]}")
        out.append(tuple(numbered))
    return out


#: the source the exported module carries
SOURCE = inspect.getsource(structural_keys)
