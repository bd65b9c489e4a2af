"""The verdict's rule on one array: numbers, non-numbers, complex, integers and booleans."""

from __future__ import annotations

import numpy as np

from workbench.core.lowering.run import compare
from workbench.core.lowering.verdict import SCALES, Verdict, check


def test_nan_and_inf_agree_where_the_unpartitioned_run_has_them():
    ref = np.array([1.0, np.nan, np.inf, -np.inf])
    same = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert check("x", "output", same, same, ref, "float32").ok
    # float64 stays finite where float32 overflowed in both runs: still the same places
    ref = np.array([1.0, 2.0, 3e38 * 10.0])
    both = np.array([1.0, 2.0, np.inf], np.float32)
    assert check("x", "output", both, both, ref, "float32").ok


def test_a_nan_the_unpartitioned_run_does_not_have_differs_and_says_where():
    ref = np.array([1.0, 2.0, 3.0])
    unpart = np.array([1.0, 2.0, 3.0], np.float32)
    part = np.array([1.0, np.nan, 3.0], np.float32)
    c = check("x", "output", part, unpart, ref, "float32")
    assert not c.ok and "NaN at [1]" in str(c) and "a number" in str(c)
    flipped = np.array([1.0, 2.0, -np.inf], np.float32)
    c = check(
        "x",
        "output",
        flipped,
        np.array([1, 2, np.inf], np.float32),
        ref * 0 + [1, 2, np.inf],
        "float32",
    )
    assert not c.ok and "-inf" in str(c)


def test_complex_outputs_differing_only_in_their_imaginary_parts_differ():
    ref = np.array([1 + 1j, 2 - 1j])
    unpart = ref.astype(np.complex64)
    part = np.array([1 + 1.5j, 2 - 1j], np.complex64)
    assert check("z", "output", unpart, unpart, ref, "complex64").ok
    assert not check("z", "output", part, unpart, ref, "complex64").ok
    assert not compare([part], [unpart])[2]
    assert compare([unpart], [unpart])[2]


def test_integers_and_booleans_must_be_equal():
    ref = np.array([1, 2, 3], np.int32)
    assert check("n", "output", ref, ref, ref, "int32").ok
    c = check("n", "output", np.array([1, 2, 4], np.int32), ref, ref, "int32")
    assert not c.ok and "1 of 3 elements differ" in str(c) and "[2]" in str(c)
    b = np.array([True, False])
    assert check("b", "output", b, b, b, "bool").ok
    assert not check("b", "output", ~b, b, b, "bool").ok


def test_rounding_scales_allow_noise_where_the_unpartitioned_run_was_exact():
    """A gradient that rounded to exactly zero unpartitioned: its tolerance is its scale."""
    ref = np.array([0.0, 0.0, 1e-3])
    unpart = np.array([0.0, 0.0, 1e-3], np.float32)
    part = np.array([3e-7, -2e-7, 1e-3], np.float32)
    assert not check("g", "output", part, unpart, ref, "float32").ok
    scale = np.array([1e-7, 1e-7, 1e-7])
    c = check("g", "output", part, unpart, ref, "float32", scale)
    assert c.ok and c.allowed == SCALES * 1e-7
    c = check("g", "output", part * 100, unpart, ref, "float32", scale)
    assert not c.ok and f"{SCALES:g} rounding scales" in str(c)


def test_the_verdict_says_what_it_compared_in_a_line():
    ok = check("x", "output", np.ones(3, np.float32), np.ones(3, np.float32), np.ones(3), "float32")
    text = str(Verdict((ok,)))
    assert text.startswith("agree: all 1 outputs") and "\n" not in text
    bad = check(
        "y", "parameter", np.full(3, 2.0, np.float32), np.ones(3, np.float32), np.ones(3), "float32"
    )
    text = str(Verdict((ok, bad)))
    assert text.startswith("DIFFER: 1 of 2 outputs") and "y (parameter): 3 of 3 elements" in text
