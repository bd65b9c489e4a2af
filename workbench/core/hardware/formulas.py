"""The alpha-beta ring formulas per collective kind (the conventions and sources:
``collectives.py`` and README.md): seconds one collective takes on one level of ``n``
devices, from its link's bandwidth and latency."""

from __future__ import annotations


def all_gather_time(out_bytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-gather of ``out_bytes`` (the gathered output) over ``n`` devices."""
    return 0.0 if n <= 1 else (n - 1) / n * out_bytes / bandwidth + (n - 1) * latency


def reduce_scatter_time(in_bytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring reduce-scatter of ``in_bytes`` (the input, before scattering)."""
    return 0.0 if n <= 1 else (n - 1) / n * in_bytes / bandwidth + (n - 1) * latency


def all_reduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce (reduce-scatter then all-gather) of ``nbytes``."""
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency


def all_to_all_time(
    nbytes: float, n: int, bandwidth: float, latency: float, topology: str = "switch"
) -> float:
    """All-to-all of a local array of ``nbytes``: direct sends on a switch, forwarded
    around a bidirectional ring on a torus (see the module docstring)."""
    if n <= 1:
        return 0.0
    factor = (n - 1) / n if topology == "switch" else (n * n // 4) / n
    return factor * nbytes / bandwidth + (n - 1) * latency


def permute_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """Collective-permute: every device sends ``nbytes`` to one peer."""
    return nbytes / bandwidth + latency
