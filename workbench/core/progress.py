"""Progress of long operations (a search, a run, a calibration): one status line, or a callback.

``with Status("Auto('model')", callback=cb) as status: ... status.show(line, info)``. With a
callback, each ``show`` calls it with ``info`` (called first when callable) and no line is
drawn. Without one, a background thread draws ``what: line [elapsed]`` on stderr, rewritten
in place with ``\\r`` (terminals and notebooks alike), once the operation has run
``DELAY_S``, at most every ``INTERVAL_S``; the line then ends with a newline saying how it
ended: done, interrupted (a KeyboardInterrupt, which propagates) or failed. A status
entered inside another is drawn as part of the outer one's line; ``stage(text)`` sets the
innermost one's line (so a helper reports without being handed the status).

Drawn when ``WORKBENCH_PROGRESS`` is 1, never when it is 0; unset, when stderr is a
terminal or a notebook's stream.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable

__all__ = ["DELAY_S", "ENV", "INTERVAL_S", "Status", "drawing_by_default", "stage"]

ENV = "WORKBENCH_PROGRESS"
DELAY_S = 1.0  # no line for an operation shorter than this
INTERVAL_S = 0.25  # the line is redrawn at most this often
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_local = threading.local()  # .active: the statuses entered in this thread, outermost first


def drawing_by_default(stream) -> bool:
    """Whether a status line is drawn on ``stream`` when the caller does not say."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    if value:
        warnings.warn(
            f"{ENV}={value!r} is neither 1 nor 0; drawing progress only on a terminal or in "
            f"a notebook. Set {ENV}=1 to always draw it, {ENV}=0 never to.",
            stacklevel=3,
        )
    notebook = type(stream).__module__.split(".")[0] == "ipykernel"
    try:
        return notebook or bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return notebook


def _active() -> list[Status]:
    if not hasattr(_local, "active"):
        _local.active = []
    return _local.active


def stage(text: str) -> None:
    """Set the line of the innermost status entered in this thread (none: nothing)."""
    active = _active()
    if active:
        active[-1].line = text


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 60 else f"{int(s // 60)} min {int(s % 60):02d} s"


class Status:
    """One operation's progress (see module doc). ``enabled`` None: ``drawing_by_default``;
    ``stream`` None: sys.stderr when entered."""

    def __init__(
        self, what: str, *, callback: Callable | None = None, enabled=None, stream=None
    ) -> None:
        self.what, self.callback, self.enabled, self.stream = what, callback, enabled, stream
        self.line, self.started, self.shown = "", time.perf_counter(), 0
        self.nested: list[Status] = []  # those drawn in this one's line, itself first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def show(self, line: str, info=None) -> None:
        """Report ``line``; with a callback, call it with ``info`` instead (see module doc)."""
        if self.callback is not None:
            self.callback(info() if callable(info) else info)
        else:
            self.line = line

    def __enter__(self) -> Status:
        self.started = time.perf_counter()
        active = _active()
        if active:
            if self.callback is None:
                active[0].nested.append(self)
        else:
            self.stream = sys.stderr if self.stream is None else self.stream
            drawn = drawing_by_default(self.stream) if self.enabled is None else self.enabled
            if drawn and self.callback is None:
                self.nested = [self]
                self._thread = threading.Thread(target=self._draw_loop, daemon=True)
                self._thread.start()
        active.append(self)
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        active = _active()
        if self in active:
            active.remove(self)
        if active and self in active[0].nested:
            active[0].nested.remove(self)
        if self._thread is None:
            return False  # a nested status, or one not drawn
        self._stop.set()
        self._thread.join()
        elapsed = time.perf_counter() - self.started
        if self.shown or elapsed >= DELAY_S:
            if kind is None:
                end = f"done in {_seconds(elapsed)}"
            elif issubclass(kind, KeyboardInterrupt):
                end = f"interrupted after {_seconds(elapsed)}"
            else:
                end = f"failed after {_seconds(elapsed)} ({kind.__name__})"
            self._write(f"{self.what}: {self.line + ', ' if self.line else ''}{end}", "\n")
        return False  # an exception, a KeyboardInterrupt too, propagates

    def text(self) -> str:
        """The line as drawn now: this status, then those nested in it."""
        parts = [f"{s.what}: {s.line}" if s.line else s.what for s in list(self.nested)]
        return " > ".join(parts) + f" [{_seconds(time.perf_counter() - self.started)}]"

    def _draw_loop(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            if time.perf_counter() - self.started >= DELAY_S:
                self._write(self.text())

    def _write(self, text: str, end: str = "") -> None:
        width = max(40, shutil.get_terminal_size((100, 24)).columns - 1)
        if len(text) > width:
            text = text[: width - 3] + "..."
        with self._lock:
            try:
                self.stream.write("\r" + text + " " * max(0, self.shown - len(text)) + end)
                self.stream.flush()
            except (OSError, ValueError):  # a closed stream: the operation goes on
                return
            self.shown = 0 if end else max(len(text), 1)
