"""Every finding code links to a page that exists: its section of the docs shipped in
the package by default, or of a hosted copy when the workspace or the editor says so."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from precompile_lsp.config import ConfigError, load_config
from precompile_lsp.doclinks import DIAGNOSTICS, doc_link, page_link
from precompile_lsp.engine import Engine
from precompile_lsp.findings import CODES
from precompile_lsp.settings import Settings, parse_settings
from tests.doc_links import documented_heading
from tests.harness import REPO

HOSTED = "https://docs.example.org/precompile/diagnostics.html"


@pytest.mark.parametrize("code", sorted(CODES))
def test_each_code_opens_its_section_of_the_shipped_docs(code: str) -> None:
    assert documented_heading(doc_link(code)) == f"## {code.lower()}"


def test_the_shipped_page_is_the_repository_page() -> None:
    assert DIAGNOSTICS.read_bytes() == (REPO / "docs" / "diagnostics.md").read_bytes()
    assert page_link() == DIAGNOSTICS.resolve().as_uri()


def test_a_hosted_base_url_gets_the_code_anchor() -> None:
    assert doc_link("PC101", HOSTED) == f"{HOSTED}#pc101"
    assert doc_link("PC302", f"{HOSTED}#top") == f"{HOSTED}#pc302"
    assert page_link(HOSTED) == HOSTED


def test_a_wheel_ships_the_page(tmp_path: Path) -> None:
    """The package data is a symlink in the checkout; the wheel must hold the page itself."""
    build = ["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)]
    subprocess.run(
        [sys.executable, "-m", "pip", *build],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("torch_precompile-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.read("precompile_lsp/docs/diagnostics.md")
    assert shipped == (REPO / "docs" / "diagnostics.md").read_bytes()


def _workspace(root: Path, table: str = "") -> Path:
    """A workspace whose only finding needs no capture: a target file that does not parse."""
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "broken.py").write_text("import precompile\ndef f(:\n")
    (root / "pyproject.toml").write_text(f"[tool.precompile]\nsource-roots = ['src']\n{table}")
    return root


async def _discovered_docs(root: Path, overrides: dict[str, str] | None = None) -> list[str]:
    engine = Engine(root, overrides=overrides, trusted=False)
    try:
        engine.discover()
        return [f.doc for fs in engine.findings_by_file().values() for f in fs]
    finally:
        await engine.close()


async def test_findings_link_the_shipped_docs_by_default(tmp_path: Path) -> None:
    [link] = await _discovered_docs(_workspace(tmp_path))
    assert documented_heading(link) == "## pc002"


async def test_docs_url_from_pyproject_and_from_the_editor(tmp_path: Path) -> None:
    root = _workspace(tmp_path, f"docs-url = '{HOSTED}'\n")
    assert await _discovered_docs(root) == [f"{HOSTED}#pc002"]
    # The editor's precompile.docsUrl wins over pyproject.toml.
    settings, errors = parse_settings({"docsUrl": "https://mirror.example.org/d.html"})
    assert errors == []
    assert await _discovered_docs(root, settings.engine_overrides()) == [
        "https://mirror.example.org/d.html#pc002"
    ]


def test_bad_docs_urls_are_refused_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.precompile]\ndocs-url = 'docs/diag.md'\n")
    with pytest.raises(ConfigError, match=r"docs-url must be the http\(s\) URL"):
        load_config(tmp_path)
    settings, errors = parse_settings({"docsUrl": 3}, Settings(docs_url=HOSTED))
    assert settings.docs_url == HOSTED and "precompile.docsUrl" in errors[0]
    cleared, errors = parse_settings({"docsUrl": ""}, Settings(docs_url=HOSTED))
    assert cleared.docs_url is None and errors == []
    assert "docs-url" not in cleared.engine_overrides()
