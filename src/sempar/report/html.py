"""A self-contained HTML report: sections of text, tables and PNG figures (embedded as base64)."""

from __future__ import annotations

import base64
import datetime as _dt
import html
from pathlib import Path
from typing import Any, Sequence

from sempar.atomic import write_text_atomic

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;color:#222;line-height:1.4}
h1{border-bottom:2px solid #444}h2{margin-top:2em;border-bottom:1px solid #bbb}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f0f0f0}
td:first-child,th:first-child{text-align:left}
figure{margin:1em 0}figcaption{font-size:.85em;color:#555}img{max-width:100%}
.note{color:#555;font-size:.9em}
"""


def fmt(v: Any) -> str:
    """Numbers to 3 significant decimals, None to an em dash."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


class HtmlReport:
    """Collect sections, then `write(path)` once (atomically)."""

    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = []

    def heading(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def paragraph(self, text: str, note: bool = False) -> None:
        cls = ' class="note"' if note else ""
        self.parts.append(f"<p{cls}>{html.escape(text)}</p>")

    def items(self, lines: Sequence[str]) -> None:
        """A bulleted list, one line each (the demo's answer, one line per case)."""
        self.parts.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in lines) + "</ul>")

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(c))}</td>" for c in r) + "</tr>"
                       for r in rows)
        self.parts.append(f"<table><tr>{head}</tr>{body}</table>")

    def image(self, path: Path, caption: str = "") -> None:
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self.parts.append(f'<figure><img alt="{html.escape(caption or Path(path).name)}" '
                          f'src="data:image/png;base64,{data}">{cap}</figure>')

    def render(self) -> str:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return ("<!doctype html><html><head><meta charset='utf-8'>"
                f"<title>{html.escape(self.title)}</title><style>{_STYLE}</style></head><body>"
                f"<h1>{html.escape(self.title)}</h1><p class='note'>generated {stamp}</p>"
                + "\n".join(self.parts) + "</body></html>\n")

    def write(self, path: Path) -> None:
        write_text_atomic(path, self.render())
