"""Output of the `sempar` verbs: `out` (stdout tables), `err` (stderr), `emit_json` for `--json`,
`note` (one line on stderr, once) and `warnings_as_note` (a library's warnings as such a note).

A low module (rich, json, numpy only) so that the verbs in `sempar.commands` and anything else
that prints for the command line share one console without importing `sempar.cli`.

Terminal safety: strings from files (model names, domains, paths) reach the terminal, so the
console layer escapes them and no verb has to remember to. `printable` is the one escaping
function (control characters, ESC, C1 controls, bidirectional overrides, and the bytes of
non-UTF-8 file names as `\\xNN`); `SafeConsole` applies it to every string it renders and never
reads rich markup (`[bold]` prints as written); `escaped_std_streams` (installed by the CLI's
main) applies it to everything else written to stdout / stderr."""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import warnings
from typing import Any, Iterator

from rich.console import Console

# C0 controls but tab and newline, DEL, C1 controls, lone surrogates (a non-UTF-8 file name's
# bytes under surrogateescape), and the invisible reorderings (bidi overrides, line separators).
_UNSAFE_LINES = "\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u200e\u200f\u2028-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[{_UNSAFE_LINES}]")
_UNSAFE_ONE_LINE = re.compile(f"[\t\n{_UNSAFE_LINES}]")


def _escape_char(m: re.Match) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:       # surrogateescape: the file name's original byte
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: object, lines: bool = False) -> str:
    """`str(text)` safe for a terminal: every control character shown as `\\xNN` / `\\uNNNN`.

    Escaped: C0 controls (ESC included), DEL, C1 controls, lone surrogates (a non-UTF-8 name's
    byte 0xff, kept by os.fsdecode as U+DCFF, prints as `\\xff`), bidi overrides and line
    separators. With `lines`, tab and newline are kept (text the program itself laid out);
    without, they are escaped too (a value that must stay on its line)."""
    s = text if isinstance(text, str) else str(text)
    return (_UNSAFE if lines else _UNSAFE_ONE_LINE).sub(_escape_char, s)


class SafeConsole(Console):
    """A rich Console that prints every string through `printable` and reads no markup.

    Every str rich renders (print arguments, table cells and titles) passes `render_str`, so
    escaping there covers them all; markup is off whatever a caller asks, so `[link=...]` or
    `[/]` in a model name prints as written instead of styling the terminal or raising."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["markup"] = False
        super().__init__(*args, **kwargs)

    def render_str(self, text: str, **kwargs: Any):  # noqa: ANN201 (rich.text.Text)
        kwargs["markup"] = False
        return super().render_str(printable(text, lines=True), **kwargs)


class _EscapingStream:
    """A text stream that writes `printable(s, lines=True)` to the stream it wraps.

    `rich_proxied_file` sends a `SafeConsole` (which has escaped its text already) straight to
    the wrapped stream, so its own colour codes survive."""

    def __init__(self, raw: Any):
        self._raw = raw

    def write(self, s: str) -> int:
        if not isinstance(s, str):      # click probes with b"": a text stream must refuse it
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self._raw.write(printable(s, lines=True))
        return len(s)

    @property
    def rich_proxied_file(self) -> Any:
        return self._raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


@contextlib.contextmanager
def escaped_std_streams() -> Iterator[None]:
    """Inside, whatever is written to sys.stdout / sys.stderr (print, sys.stderr.write, the
    error line) has its control characters escaped (`printable`)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _EscapingStream(sys.stdout), _EscapingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


err = SafeConsole(stderr=True)
out = SafeConsole()
if not out.is_terminal:         # piped or logged: rich's 80 columns would squeeze the tables
    out = SafeConsole(width=160)


def json_default(o: Any) -> Any:
    """`json.dumps(default=...)` for numpy scalars and arrays; anything else is a TypeError."""
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float (NaN, +-Infinity; numpy's too) replaced by None, dicts,
    lists and tuples rebuilt, numpy arrays as lists: what JSON can say (RFC 8259 has no NaN)."""
    import numpy as np

    if isinstance(obj, float):          # np.float64 is a float
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return finite(obj.tolist())
    if isinstance(obj, np.floating):
        return finite(float(obj))
    return obj


def json_text(obj: Any, indent: int | None = 1) -> str:
    """The one JSON writer of sempar's reports (`--json`, analysis.json, summary.json, bench
    results): strict JSON, non-finite numbers written as null (`finite`)."""
    return json.dumps(finite(obj), indent=indent, default=json_default, allow_nan=False)


def emit_json(obj: Any) -> None:
    """Print `obj` as the one JSON object of `--json` on stdout (indent 1; NaN and Infinity as
    null, `json_text`) and flush."""
    sys.stdout.write(json_text(obj) + "\n")
    sys.stdout.flush()


_noted: set[str] = set()


def note(key: str, message: str) -> None:
    """`note: message` as one line on stderr, the first time `key` is noted in this process."""
    if key in _noted:
        return
    _noted.add(key)
    err.print(f"note: {message}", markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def warnings_as_note(category: type[Warning], what: str) -> Iterator[None]:
    """Inside, warnings of `category` (a library's, e.g. scikit-learn's ConvergenceWarning) are
    not printed raw: the first of the process becomes one line `note: {what}: {its message}`
    (`note`, keyed by the category: one cause, e.g. duplicate points, reaches several solvers);
    other warnings are shown as before."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", category)
        shown = warnings.showwarning

        def show(message, cat, filename, lineno, file=None, line=None):  # noqa: ANN001
            if issubclass(cat, category):
                note(f"{cat.__module__}.{cat.__qualname__}",
                     f"{what}: {' '.join(str(message).split())} (from "
                     f"{cat.__module__.split('.')[0]}; later ones not shown)")
            else:
                shown(message, cat, filename, lineno, file, line)

        warnings.showwarning = show
        yield
