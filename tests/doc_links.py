"""Where a finding's documentation link lands."""

from __future__ import annotations

import urllib.parse
import urllib.request
from pathlib import Path


def documented_heading(link: str) -> str:
    """The line a finding's documentation link opens: links to the shipped docs are
    ``file:`` URIs with ``#L<line>``, which editors open at that line."""
    parsed = urllib.parse.urlsplit(link)
    assert parsed.scheme == "file" and parsed.fragment.startswith("L"), link
    page = Path(urllib.request.url2pathname(parsed.path))
    return page.read_text(encoding="utf-8").splitlines()[int(parsed.fragment[1:]) - 1]
