"""The result cache answers only for what a result was computed from: a verification
depends on the artifact's ``.cache`` and ``.sig`` bytes and the trusted keys' contents,
not only on the artifact's ``.py``; a target whose module failed to import is never
answered from the cache (what an import failure depends on is unbounded); a corrupt
cache entry is a miss, never a crash or a wrong answer."""

from __future__ import annotations

import asyncio
import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from precompile_lsp.engine import Engine
from tests.harness import precompile_cli
from tests.server.conftest import check_json

_MODEL = """\
import torch

import precompile


def calls():
    return [(torch.nn.Linear(4, 4), torch.randn(2, 4))]


@precompile.target(calls, backend="eager", tracer="make_fx", artifact="artifacts/one.py")
def one(model, x):
    return model(x).relu()


@precompile.target(calls, backend="eager", tracer="make_fx", artifact="artifacts/two.py")
def two(model, x):
    return model(x).sigmoid() * 3
"""


def _workspace(root: Path, files: dict[str, str]) -> Path:
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [project]
            name = "ws"
            version = "0"

            [tool.precompile]
            source-roots = ["src"]
            backend = "eager"
            tracer = "make_fx"
            timeout = 120
            """
        )
    )
    for name, text in files.items():
        path = root / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _codes(document: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((f["code"], f["target"] or "") for f in document["findings"])


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = _workspace(tmp_path_factory.mktemp("keys"), {"pkg/__init__.py": "", "pkg/m.py": _MODEL})
    proc = precompile_cli("check", "--emit", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def test_verify_depends_on_the_cache_bytes(emitted: Path, tmp_path: Path) -> None:
    """Emit and verify, then copy another target's .cache over this one's: the next
    `check --verify` verifies again and fails, instead of answering from the cache."""
    root = tmp_path / "ws"
    shutil.copytree(emitted, root)
    code, document = check_json(root, "--verify")
    assert code == 0 and document["findings"] == [], document
    code, document = check_json(root, "--verify")  # unchanged: answered from the cache
    assert code == 0 and document["stats"]["verifies"] == 0, document["stats"]

    artifacts = root / "artifacts"
    shutil.copyfile(artifacts / "two.cache", artifacts / "one.cache")
    code, document = check_json(root, "--verify")
    assert code == 1, document
    assert _codes(document) == [("PC303", "pkg.m.one")], document["findings"]
    assert "code_hash differs" in document["findings"][0]["message"]

    # The .cache's absence is part of the key too: without it the pair loads (from
    # source) and verifies, and that is a new verification, not the stale failure.
    (artifacts / "one.cache").unlink()
    code, document = check_json(root, "--verify")
    assert code == 0 and document["stats"]["verifies"] == 1, document


def _verify(root: Path, keys: list[str]) -> list[str]:
    async def run() -> list[str]:
        engine = Engine(root, trusted=True, use_cache=True, trusted_keys=keys)
        try:
            (decl,) = [d for d in await engine.discover_async() if d.function == "one"]
            return (await engine.verify(decl)).verify_failures
        finally:
            await engine.close()

    return asyncio.run(run())


def test_verify_depends_on_the_signature_and_the_trusted_keys(
    emitted: Path, tmp_path: Path
) -> None:
    """A verification with trusted keys is of the pair's signature and of the keys'
    contents: a .sig replaced by another key's signature, or a key file rotated in
    place, is verified again (and refused), not answered from the cache."""
    import precompile

    root = tmp_path / "ws"
    shutil.copytree(emitted, root)
    private, public, _ = precompile.generate_key(tmp_path / "mine")
    other_private, other_public, _ = precompile.generate_key(tmp_path / "other")
    artifact, cache = root / "artifacts" / "one.py", root / "artifacts" / "one.cache"
    precompile.sign(artifact, cache, private)
    signature = root / "artifacts" / "one.sig"
    good = signature.read_bytes()
    assert _verify(root, [public]) == []
    assert _verify(root, [public]) == []  # from the cache (nothing changed)

    precompile.sign(artifact, cache, other_private)  # a .sig by a key we do not trust
    (failure,) = _verify(root, [public])
    assert failure.startswith("it does not load:"), failure

    signature.write_bytes(good)
    assert _verify(root, [public]) == []
    signature.unlink()  # no signature at all
    (failure,) = _verify(root, [public])
    assert "is not signed" in failure, failure

    signature.write_bytes(good)
    Path(public).write_bytes(Path(other_public).read_bytes())  # the key file, rotated
    (failure,) = _verify(root, [public])
    assert failure.startswith("it does not load:"), failure


_BROKEN = """\
import torch

import precompile
from pkg.later import helper


@precompile.target(lambda: [(torch.nn.Linear(4, 4), torch.randn(2, 4))], backend="eager")
def target(model, x):
    return helper(model(x))
"""


def test_a_fixed_import_error_is_not_reported_from_the_cache(tmp_path: Path) -> None:
    """The target imports a module that does not exist yet: `check` fails (exit 1). Once
    the missing module is created -- a new file under the source roots, the target's own
    file untouched -- the next `check` passes."""
    root = _workspace(tmp_path, {"pkg/__init__.py": "", "pkg/t.py": _BROKEN})
    for _ in range(2):  # the second run must not pass from (or be stuck on) a cached result
        code, document = check_json(root)
        assert code == 1, document
        (finding,) = document["findings"]
        assert "pkg.later" in finding["message"], finding
    (root / "src" / "pkg" / "later.py").write_text("def helper(y):\n    return y.relu()\n")
    code, document = check_json(root)
    assert code == 0 and document["findings"] == [], document
    assert document["stats"]["captures"] == 1
    code, document = check_json(root)  # a target that imports is cached as before
    assert code == 0 and document["stats"]["cache_hits"] == 1, document["stats"]


def test_another_decorator_raising_at_import_is_not_cached(tmp_path: Path) -> None:
    """Another decorator in the target's file raises when the module is imported: fixed
    in a helper module the target's file imports, the next check passes."""
    source = _BROKEN.replace("from pkg.later import helper", "from pkg.deco import helper, deco")
    source += "\n\n@deco\ndef other():\n    pass\n"
    raising = "def helper(y):\n    return y\n\n\ndef deco(f):\n    raise ValueError('bad deco')\n"
    root = _workspace(tmp_path, {"pkg/__init__.py": "", "pkg/t.py": source, "pkg/deco.py": raising})
    code, document = check_json(root)
    assert code == 1 and "bad deco" in document["findings"][0]["message"], document
    (root / "src" / "pkg" / "deco.py").write_text(
        raising.replace("raise ValueError('bad deco')", "return f")
    )
    code, document = check_json(root)
    assert code == 0 and document["findings"] == [], document


def test_a_corrupt_cache_entry_is_a_miss(emitted: Path, tmp_path: Path) -> None:
    """Entries cut short, not UTF-8, of the wrong shape: each is a miss (the target is
    captured again, with its real findings), never a crash."""
    root = tmp_path / "ws"
    shutil.copytree(emitted, root)
    code, _ = check_json(root)
    assert code == 0
    entries = sorted((root / ".precompile" / "cache").glob("*.json"))
    assert entries
    originals = {p: p.read_text() for p in entries}

    def shapes(text: str) -> list[str]:
        entry = json.loads(text)
        bad_dependencies = {**entry, "dependencies": ["not", "a", "map"]}
        bad_packages = {**entry, "packages": 7}
        bad_result = {**entry, "result": {"status": "no such status"}}
        not_a_map = {**entry, "result": [1, 2]}
        return [
            text[: len(text) // 2],
            "\udcff",
            json.dumps(bad_dependencies),
            json.dumps(bad_packages),
            json.dumps(bad_result),
            json.dumps(not_a_map),
            json.dumps([entry]),
        ]

    for variant in range(7):
        for path, text in originals.items():
            corrupt = shapes(text)[variant]
            if corrupt == "\udcff":
                path.write_bytes(b"\xff\xfe{not utf-8")
            else:
                path.write_text(corrupt)
        code, document = check_json(root)
        assert code == 0 and document["findings"] == [], (variant, document)
        assert document["stats"]["captures"] == 2, (variant, document["stats"])
