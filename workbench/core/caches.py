"""The process-wide caches of the engine, in one registry with one ``clear_caches()``.

A cache that outlives one call (canonical shardings, op layouts, elementwise mappings,
selector patterns, redistribution plans) is made with `cache` (an LRU on hashable keys) or
registered with `register` (its own store and a function that empties it). The derived
facts of one Program live in the Program's own `DerivedCache` (``ir.program``), not here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

_CLEARERS: dict[str, Callable[[], None]] = {}


def register(name: str, clear: Callable[[], None]) -> None:
    """Register a process-wide cache under ``name`` by the function that empties it."""
    if name in _CLEARERS:
        raise ValueError(f"a cache named {name!r} is already registered")
    _CLEARERS[name] = clear


def cache(name: str, maxsize: int):
    """``functools.lru_cache(maxsize)``, registered under ``name``."""

    def wrap(fn):
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        register(name, cached.cache_clear)
        return cached

    return wrap


def registered() -> tuple[str, ...]:
    """The names of every registered process-wide cache."""
    return tuple(_CLEARERS)


def clear_caches() -> None:
    """Empty every process-wide cache: what follows computes as in a fresh process."""
    for clear in _CLEARERS.values():
        clear()
