"""Human-readable quantities."""


def format_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def format_seconds(s: float) -> str:
    """``0.00123`` -> ``1.23 ms``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale or unit == "us":
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"  # pragma: no cover
