"""What ``run`` takes: the lowering, the input arrays, the steps to time and the devices,
each checked before anything compiles, so a bad one is an error that says what would work."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from workbench.core.errors import DeviceError, InputError, LimitError, given

LOWERINGS = ("explicit", "constrained", "propagated")
#: The most timed steps one run takes.
MAX_REPEATS = 10_000


def checked_arguments(session, lowering, args, repeats, devices, training_loop) -> list | None:
    """``run``'s arguments checked before anything compiles; the flat input arrays (None
    when ``args`` is: the example's)."""
    if lowering not in LOWERINGS:
        raise InputError(f"lowering={given(lowering)} is not a lowering; use one of {LOWERINGS}.")
    if not isinstance(repeats, int) or isinstance(repeats, bool):
        raise InputError(
            f"repeats={given(repeats)} is not an integer; give the steps to time, e.g. 5."
        )
    if not 1 <= repeats <= MAX_REPEATS:
        raise LimitError(
            f"repeats={repeats} is outside 1 to {MAX_REPEATS:,}; give steps to time in it."
        )
    if not isinstance(training_loop, bool):
        raise InputError(f"training_loop={given(training_loop)} is not True or False.")
    check_devices(session.mesh, devices)
    program = session.program
    if args is None:
        return None
    try:
        flat = [jnp.asarray(a) for a in jax.tree.leaves(args)]
    except (TypeError, ValueError) as err:
        raise InputError(
            f"args={given(args)} holds something that is not an array ({err})."
        ) from None
    values = program.input_values
    if len(flat) != len(values):
        raise InputError(
            f"args={given(args)} holds {len(flat)} arrays but {program.name} takes {len(values)} "
            f"({', '.join(v.name for v in values[:4])}{', ...' if len(values) > 4 else ''}); "
            "pass the same arguments capture was given, as one tuple: args=(params, batch)."
        )
    for i, (a, v) in enumerate(zip(flat, values)):
        if tuple(a.shape) != tuple(v.shape) or a.dtype != v.dtype:
            raise InputError(
                f"args: array #{i} is {a.dtype}{list(a.shape)} but input {v.name!r} is "
                f"{v.dtype}{list(v.shape)}; pass arrays of the captured shapes and dtypes, in "
                "the order capture was given them."
            )
    return flat


def check_devices(mesh, devices) -> None:
    """``devices`` (None: all attached) are distinct JAX devices, as many as ``mesh`` spans."""
    if devices is not None and not (
        isinstance(devices, list | tuple | np.ndarray)
        and all(isinstance(d, jax.Device) for d in np.ravel(np.asarray(devices, dtype=object)))
    ):
        raise InputError(
            f"devices={given(devices)} is not a list of JAX devices; give e.g. "
            f"devices=jax.devices()[:{mesh.size}], or None for all attached."
        )
    found = list(jax.devices() if devices is None else np.ravel(np.asarray(devices, dtype=object)))
    if len(set(found)) != len(found):
        raise InputError(f"devices={given(devices)} lists a device twice; list each once.")
    if len(found) == mesh.size:
        return
    n, platform = len(found), found[0].platform if found else "no"
    if devices is not None:
        fix = f"give {mesh.size} of them (e.g. devices=jax.devices()[:{mesh.size}])"
    elif n > mesh.size:
        fix = f"pass devices=jax.devices()[:{mesh.size}] to run on the first {mesh.size}"
    else:
        fix = (
            f"use a mesh whose sizes multiply to {n}, or on a CPU set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={mesh.size} before jax is imported (that "
            "many virtual devices)"
        )
    raise DeviceError(
        f"{mesh} needs {mesh.size} devices but {n} {platform} device(s) are "
        f"{'attached' if devices is None else 'given'}; {fix}."
    )
