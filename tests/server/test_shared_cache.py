"""A result cache in a folder CI shares between runners (``cache-dir``): concurrent
writers, entries verified on read, bounded by LRU eviction, keyed by the Python build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from precompile_lsp.config import ConfigError, load_config
from precompile_lsp.protocol import JobKind, JobResult, Outcome
from precompile_lsp.result_cache import ResultCache
from tests.harness import fresh_env
from tests.server.conftest import FIXTURES

SHOP_TARGETS = 4  # clean, with_gap, stale, with_helper_break (the method is not a target)


def _cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "precompile_lsp.cli", *args],
        cwd=cwd,
        env=fresh_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def check(workspace: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = _cli("check", "--format", "json", *args, cwd=workspace)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode in (0, 1), err
    return proc.returncode, json.loads(out)


def comparable(document: dict[str, Any]) -> Any:
    return document["findings"], [
        {k: v for k, v in row.items() if k not in ("file", "artifact", "dependencies")}
        for row in document["targets"]
    ]


def test_concurrent_checks_share_one_cache_dir_and_a_corrupt_entry_is_recaptured(
    tmp_path: Path,
) -> None:
    runners = []
    for name in ("runner1", "runner2"):  # two checkouts, as two CI runners have
        runners.append(tmp_path / name / "shop")
        shutil.copytree(FIXTURES / "workspace", runners[-1])
    cache = tmp_path / "shared-cache"  # outside both workspaces: named, so allowed
    reference_code, reference = check(runners[0], "--no-cache")
    # Both at once, on one cache folder: each captures and publishes every entry.
    procs = [_cli("check", "--format", "json", "--cache-dir", str(cache), cwd=r) for r in runners]
    outputs = [p.communicate(timeout=600) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == reference_code, err
        assert comparable(json.loads(out)) == comparable(reference)
    entries = sorted(cache.glob("*.json"))
    assert len(entries) == SHOP_TARGETS, entries
    assert not list(cache.glob("*.tmp")) and not list(cache.glob(".*.tmp"))
    for runner in runners:  # the workspace's own cache was not used
        assert not (runner / ".precompile" / "cache").exists()
    # Either runner now answers from the shared folder alone.
    code, warm = check(runners[1], "--cache-dir", str(cache))
    assert code == reference_code and comparable(warm) == comparable(reference)
    assert warm["stats"]["captures"] == 0 and warm["stats"]["cache_hits"] == SHOP_TARGETS

    # A corrupt entry (valid JSON, a finding's words changed) and a foreign one (another
    # target's entry under this one's name): each is a miss, captured again, never served.
    first, second = entries[0], entries[1]
    entry = json.loads(first.read_text())
    text = json.dumps(entry)
    assert '"ok"' in text
    first.write_text(text.replace('"ok"', '"error"', 1))
    second.write_text(entries[2].read_text())
    code, healed = check(runners[0], "--cache-dir", str(cache))
    assert code == reference_code and comparable(healed) == comparable(reference)
    assert healed["stats"]["captures"] == 2 and healed["stats"]["cache_hits"] == SHOP_TARGETS - 2
    # ... and the re-captures replaced them: all hits again.
    code, again = check(runners[0], "--cache-dir", str(cache))
    assert again["stats"]["captures"] == 0 and comparable(again) == comparable(reference)


def _result(n: int) -> JobResult:
    return JobResult(status=Outcome.OK, kind=JobKind.CHECK, message="x" * 2000 + str(n))


def test_eviction_drops_the_least_recently_used_and_only_entries(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    cache = ResultCache(tmp_path, True, folder, max_bytes=10**9)
    keys = [f"key {i}" for i in range(6)]
    for i, key in enumerate(keys):
        assert cache.put(key, _result(i), seconds=0.5) is None
    paths = {key: cache._path(key) for key in keys}
    for age, key in enumerate(reversed(keys)):  # key 0 oldest, key 5 newest
        os.utime(paths[key], (time.time() - 100 * (age + 1),) * 2)
    assert cache.get(keys[0]) is not None  # a hit: key 0 is now the most recently used
    assert cache.seconds(keys[0]) == 0.5
    # Files that are not entries: never deleted, whatever their name or age.
    stranger = folder / ("0" * 32 + ".json")
    stranger.write_text('{"not": "ours"}')
    os.utime(stranger, (1, 1))
    stale_tmp = folder / f".{'1' * 32}.{'ab' * 16}.tmp"
    stale_tmp.write_text("half written by a writer that died")
    os.utime(stale_tmp, (1, 1))
    size = paths[keys[0]].stat().st_size
    cache.max_bytes = int(size * 3.5)  # room for 3 of the 6
    cache.evict()
    kept = [k for k in keys if paths[k].exists()]
    assert kept == [keys[0], keys[4], keys[5]], kept
    assert stranger.exists() and not stale_tmp.exists()
    for key in kept:
        assert cache.get(key) is not None
    # Eviction of an entry another process is reading is harmless: an open file reads on.
    with paths[keys[5]].open("rb") as reader:
        cache.max_bytes = 1
        cache.evict()
        assert not paths[keys[5]].exists()
        assert json.loads(reader.read())["key"] == keys[5]
    assert cache.get(keys[5]) is None  # gone: a miss, not an error
    assert stranger.exists()


def test_an_entry_whose_key_names_a_workspace_path_hits(tmp_path: Path) -> None:
    """A key may hold a path inside the workspace (``python = ".venv/bin/python"``): the
    entry stores it relative, and verifying the entry must compare like with like."""
    cache = ResultCache(tmp_path, True, tmp_path / "c")
    key = f"check\n{tmp_path}/.venv/bin/python\n"
    assert cache.put(key, _result(1), seconds=2.0) is None
    assert str(tmp_path) not in (tmp_path / "c").joinpath(cache._path(key).name).read_text()
    hit = cache.get(key)
    assert hit is not None and hit.message == _result(1).message
    assert cache.seconds(key) == 2.0


def test_a_write_evicts_past_the_bound(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path, True, tmp_path / "c", max_bytes=1)
    assert cache.put("only", _result(0)) is None  # the first write of a run evicts
    assert list((tmp_path / "c").glob("*.json")) == []


def test_cache_dir_setting(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.precompile]\ncache-dir = "../ci-cache"\ncache-max-mb = 2\n'
    )
    config = load_config(tmp_path)
    assert config.cache_dir == (tmp_path.parent / "ci-cache").resolve()
    assert config.cache_max_bytes == 2 * 1024 * 1024 and config.warnings == ()
    for bad, said in [("7", "must be a folder path"), ('""', "must be a folder path")]:
        (tmp_path / "pyproject.toml").write_text(f"[tool.precompile]\ncache-dir = {bad}\n")
        with pytest.raises(ConfigError, match=said):
            load_config(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.precompile]\ncache-max-mb = 0\n")
    with pytest.raises(ConfigError, match="cache-max-mb"):
        load_config(tmp_path)


def test_another_python_build_or_torch_build_never_shares_an_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key holds the interpreter's build and torch's full version (its +cpu/+cu
    local part too), read from the installed metadata without importing torch."""
    from precompile_lsp import job_requests
    from precompile_lsp.engine import Engine

    shutil.copytree(FIXTURES / "workspace", tmp_path / "ws")
    here = Engine(tmp_path / "ws")
    decl = here.discover()[0]
    key = here.requests.cache_key(decl, JobKind.CHECK)
    import importlib.metadata

    assert json.dumps(importlib.metadata.version("torch")) in key  # e.g. "2.13.0+cpu"
    monkeypatch.setattr(job_requests, "build_identity", lambda: "pypy-3.11 another build")
    other = Engine(tmp_path / "ws")
    assert other.requests.cache_key(other.discover()[0], JobKind.CHECK) != key
