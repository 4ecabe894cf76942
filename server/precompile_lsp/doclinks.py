"""Where each finding code is documented.

The page is docs/diagnostics.md, shipped inside this package (``precompile_lsp/docs``),
so a link opens offline and matches the installed version: a ``file:`` URI with the line
of the code's heading as ``#L<line>``, which editors (VS Code among them) open at that
line. A team that hosts the docs sets a base URL (``[tool.precompile] docs-url`` or the
editor setting ``precompile.docsUrl``) and gets ``<base>#pc101`` instead.
"""

from __future__ import annotations

import functools
from pathlib import Path

#: The shipped page (a symlink to docs/diagnostics.md in a checkout; a copy in a wheel).
DIAGNOSTICS = Path(__file__).resolve().parent / "docs" / "diagnostics.md"


@functools.cache
def heading_lines() -> dict[str, int]:
    """1-based line of each code's ``## pc101`` heading in the shipped page."""
    lines: dict[str, int] = {}
    try:
        text = DIAGNOSTICS.read_text(encoding="utf-8")
    except OSError:
        return lines  # a broken install: links still name the page
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("## "):
            lines.setdefault(line[3:].strip().lower(), number)
    return lines


def page_link(docs_url: str | None = None) -> str:
    """The page that documents every code."""
    return docs_url if docs_url else DIAGNOSTICS.resolve().as_uri()


def doc_link(code: str, docs_url: str | None = None) -> str:
    """The link that documents ``code``: its anchor at ``docs_url`` when one is set, else
    its heading's line in the shipped page."""
    anchor = code.lower()
    if docs_url:
        return f"{docs_url.split('#', 1)[0]}#{anchor}"
    line = heading_lines().get(anchor)
    return f"{page_link()}#L{line}" if line else page_link()
