"""Where an op was written: the user's line, and the library line beside it.

From an equation's traceback (innermost frame first), by file path alone:
- *jax*: JAX itself (``jax``, ``jaxlib`` and its plugins) and the standard library; skipped;
- *library*: a package under ``site-packages``/``dist-packages`` (Flax, optax, Hugging Face
  transformers, Equinox, Haiku, ...), one of those imported from elsewhere (an editable
  install), and the workbench's own package, except its model zoo (``workbench/models``);
- *user*: everything else (the zoo included): a script, a notebook cell, a test file.

``code_lines(traceback)`` gives ``(user, library)``: the innermost user frame and the
innermost library frame inside it (an optimizer's op: the user's ``optimizer.update(...)``
line and optax's own), each ``"path:line (function)"`` or ``""``. Cached per file and per
code location, so capture stays linear in the equations it reads.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import sysconfig

from workbench.core import caches

#: Libraries recognised wherever they are installed (an editable install is not under
#: site-packages); any other package under site-packages is a library too.
KNOWN_LIBRARIES = ("flax", "optax", "transformers", "equinox", "haiku", "chex", "orbax", "penzai")
_JAX = frozenset({"jax", "jaxlib", "jax_plugins"})
_SITE = frozenset({"site-packages", "dist-packages"})
_WORKBENCH = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ZOO = os.path.join(_WORKBENCH, "models") + os.sep
_LINE = re.compile(r"^(?P<file>.*):(?P<line>\d+) \((?P<function>.*)\)$")


def _stdlib() -> tuple[str, ...]:
    paths = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib")}
    paths.add(os.path.dirname(contextlib.__file__))
    return tuple(p + os.sep for p in paths if p)


def package_dirs() -> tuple[tuple[str, str], ...]:
    """``(dir + sep, package)`` of JAX and the known libraries imported so far."""
    out = []
    for name in (*_JAX, *KNOWN_LIBRARIES):
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) if module is not None else None
        if origin:
            out.append((os.path.dirname(os.path.abspath(origin)) + os.sep, name))
    return tuple(out)


@caches.cache("ir.source files", maxsize=16384)
def file_kind(filename: str, packages: tuple = ()) -> tuple[str, str]:
    """``(kind, package)`` of a source file: kind "jax", "library" or "user" (module doc);
    ``packages``: ``package_dirs()``, the imported libraries' directories."""
    if filename.startswith(("<string>", "<frozen ")):
        return "jax", ""  # generated code: nobody's line (<stdin>, a notebook cell: the user's)
    if filename.startswith(_WORKBENCH + os.sep):
        return ("user", "") if filename.startswith(_ZOO) else ("library", "workbench")
    parts = os.path.normpath(filename).split(os.sep)
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in _SITE:
            top = parts[i + 1].removesuffix(".py")
            return ("jax", top) if top in _JAX else ("library", top)
    for prefix, name in packages:
        if filename.startswith(prefix):
            return ("jax", name) if name in _JAX else ("library", name)
    if filename.startswith(_stdlib()):
        return "jax", ""
    return "user", ""


@caches.cache("ir.source lines", maxsize=65536)
def _line(code, lasti: int) -> str:
    from jax._src.lib import xla_client

    line = xla_client.Traceback.code_addr2location(code, lasti)[0]
    return f"{code.co_filename}:{line} ({code.co_qualname})"


def code_lines(traceback, packages: tuple | None = None) -> tuple[str, str]:
    """``(user line, library line)`` of an equation's traceback (module doc); ``("", "")``
    for none. ``packages``: ``package_dirs()`` once per capture (else computed here)."""
    if traceback is None:
        return "", ""
    packages = package_dirs() if packages is None else packages
    codes, lastis = traceback.raw_frames()
    library = None
    for code, lasti in zip(codes, lastis):
        kind, _ = file_kind(code.co_filename, packages)
        if kind == "user":
            return _line(code, lasti), (_line(*library) if library else "")
        if kind == "library" and library is None:
            library = (code, lasti)
    return "", (_line(*library) if library else "")


def split(line: str) -> tuple[str, int, str] | None:
    """``"path:line (function)"`` -> ``(path, line, function)``; None for ``""``."""
    m = _LINE.match(line) if line else None
    return (m["file"], int(m["line"]), m["function"]) if m else None


def short(line: str, *, library: bool = False) -> str:
    """``"/a/b/lm.py:42 (mlp)"`` -> ``"lm.py:42 (mlp)"``; a library line keeps its package:
    ``"optax: transform.py:99 (update_moment)"``. ``""`` stays ``""``."""
    parts = split(line)
    if parts is None:
        return line
    path, n, fn = parts
    text = f"{os.path.basename(path)}:{n} ({fn})"
    if library:
        package = file_kind(path, package_dirs())[1]
        text = f"{package}: {text}" if package else text
    return text


def where(source: str, library: str = "", *, full: bool = False) -> str:
    """The user's line, then the library's: ``"lm.py:42 (mlp), in flax: linear.py:9 (f)"``;
    ``""`` where nothing is known. ``full``: the whole lines, one a line, the library's
    always second (``"/a/lm.py:42 (mlp)\n/b/flax/linear.py:9 (f)"``)."""
    if full:
        return f"{source}\n{library}" if library else source
    return ", in ".join(t for t in (short(source), short(library, library=True)) if t)
