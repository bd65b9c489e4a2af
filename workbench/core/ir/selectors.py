"""Selectors: which values a tactic is about.

A selector is a glob over value names (``params/**/w_in``, ``**/mlp/*``), a tag
(``tag:attn_out``, the values tagged so in any scope), or a list of these (their union).
``*`` and ``?`` match within one ``/``-separated segment, ``**`` any number of whole
segments, and ``{a,b}`` either alternative; a backslash takes the next character as it is
(``exact(name)`` writes a selector matching one name and nothing else).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from workbench.core import caches
from workbench.core.errors import SelectorError, closest_names, given
from workbench.core.ops import traits as traits_of

Selector = str | Sequence[str]

_HELP = (
    "Use '*' within a name segment, '**' for any number of whole segments and {a,b} for "
    "alternatives, e.g. 'params/**/w_in' or '**/mlp/{w_in,w_out}'; or 'tag:NAME' for tagged values."
)


@caches.cache("ir.selector patterns", maxsize=1024)
def compile_glob(pattern: str) -> re.Pattern:
    """The regex for one glob, or SelectorError saying what is malformed."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise SelectorError(f"selector {pattern!r} is empty. {_HELP}")
    if "***" in pattern:
        raise SelectorError(f"selector {pattern!r} is malformed: '***' has no meaning. {_HELP}")
    out, i, depth = [], 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if pattern.startswith("**", i):
            before_ok = i == 0 or pattern[i - 1] == "/"
            after_ok = i + 2 == len(pattern) or pattern[i + 2] == "/"
            if not (before_ok and after_ok):
                raise SelectorError(
                    f"selector {pattern!r} is malformed: '**' must be a whole path segment "
                    f"(like 'a/**/b'), found at position {i}. {_HELP}"
                )
            if i + 2 < len(pattern):  # '**/' matches zero or more segments
                out.append("(?:[^/]*/)*")
                i += 3
            else:
                out.append(".*")
                i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "{":
            depth += 1
            out.append("(?:")
        elif c == "}":
            if depth == 0:
                raise SelectorError(f"selector {pattern!r} is malformed: unbalanced '}}'. {_HELP}")
            depth -= 1
            out.append(")")
        elif c == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(c))
        i += 1
    if depth:
        raise SelectorError(f"selector {pattern!r} is malformed: unbalanced '{{'. {_HELP}")
    return re.compile("".join(out) + r"\Z")


_SPECIAL = re.compile(r"[*?{}\\]")


def literal_name(pattern: str) -> str | None:
    """The one name a pattern without wildcards matches (escapes undone), else None."""
    if not _SPECIAL.search(pattern):
        return pattern
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(pattern[i + 1])
            i += 2
            continue
        if c in "*?{}":
            return None
        out.append(c)
        i += 1
    return "".join(out)


def exact(name: str) -> str:
    """A selector matching the value named ``name`` alone (glob characters escaped)."""
    return re.sub(r"([\\*?{},])", r"\\\1", name)


def _patterns(selector: Selector, where: str = "a selector") -> list[str]:
    if isinstance(selector, str):
        return [selector]
    if isinstance(selector, Sequence) and selector and all(isinstance(s, str) for s in selector):
        return list(selector)
    if isinstance(selector, Sequence) and not selector:
        why = f"{where} is an empty list, which selects nothing; name at least one pattern"
    else:
        why = f"{where} must be a name pattern (a str) or a list of them; got {given(selector)}"
    raise SelectorError(f"{why}. {_HELP}")


def check_selector(selector: Selector, where: str = "selector") -> Selector:
    """``selector`` with every pattern checked (SelectorError naming ``where`` if one is
    malformed) and a list made a tuple; whether it matches is the program's to say, and so
    is a blank pattern (a form's empty field: ``select`` refuses it)."""
    for pattern in _patterns(selector, where):
        body = pattern[4:] if pattern.startswith("tag:") else pattern
        if body.strip() and literal_name(body) is None:
            try:
                compile_glob(body)  # raises on an empty or malformed pattern
            except SelectorError as err:  # it names the pattern; say whose it is
                owner = where.rsplit(": ", 1)[0] if ": " in where else ""
                raise SelectorError(f"{owner}: {err}" if owner else str(err)) from None
    return selector if isinstance(selector, str) else tuple(selector)


def select(program, selector: Selector, *, required: bool = True) -> list[int]:
    """Value ids matching ``selector``, in id order. Raises when nothing matches and ``required``."""
    ids: set[int] = set()
    for pattern in _patterns(selector):
        if pattern.startswith("tag:"):
            tag = pattern[4:]
            compile_glob(tag)
            ids.update(_tagged(program, tag))
            continue
        name = literal_name(pattern) if isinstance(pattern, str) and pattern.strip() else None
        if name is not None:  # no wildcard: the name index answers
            if program.has_value(name):
                ids.add(program.value(name).id)
            continue
        regex = compile_glob(pattern)  # checks the pattern
        ids.update(v.id for v in program.values if regex.match(v.name))
    if not ids and required:
        raise SelectorError(_no_match_message(program, selector))
    return sorted(ids)


def _tagged(program, tag_glob: str) -> list[int]:
    regex = compile_glob(tag_glob)
    out = []
    for op in program.ops:
        tag = traits_of(op.primitive).tag
        if tag and regex.match(str(op.params.get(tag, ""))):
            out.append(op.results[0])
    return out


def _no_match_message(program, selector) -> str:
    text = selector if isinstance(selector, str) else list(selector)
    first = _patterns(selector)[0]
    literal = first.replace("**/", "").replace("*", "").replace("?", "")
    hints = closest_names(literal, [v.name for v in program.values])
    msg = f"selector {text!r} matches no value of program {program.name!r}."
    if hints:
        msg += " Close names: " + ", ".join(hints) + "."
    top = sorted({v.name.split("/")[0] for v in program.values if v.kind == "input"})
    msg += f" Inputs start with {top}; program.names('{top[0]}/**') lists them." if top else ""
    return msg
