"""``precompile check`` of a workspace it cannot write: the findings as usual and one
warning that the result cache could not be written (the cache is an optimisation); an
emit there is a finding per target saying the artifact cannot be written."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness import precompile_cli
from tests.read_only import read_only_copy
from tests.server.conftest import FIXTURES


def test_a_read_only_workspace_is_checked_with_one_warning(tmp_path: Path) -> None:
    with read_only_copy(FIXTURES / "workspace", tmp_path / "mnt") as root:
        proc = precompile_cli("check", "--format", "json", cwd=root)
        assert proc.returncode == 1, proc.stderr  # the workspace's findings, not exit 2
        document = json.loads(proc.stdout)
        codes = sorted({f["code"] for f in document["findings"]})
        assert codes == ["PC002", "PC003", "PC101", "PC201", "PC302"], document["findings"]
        warnings = [line for line in proc.stderr.splitlines() if "result cache" in line]
        assert len(warnings) == 1, proc.stderr
        assert "Read-only file system" in warnings[0] and "--no-cache" in warnings[0]
        assert "internal error" not in proc.stderr
        assert not (root / ".precompile").exists()

        # An emit is an explicit request to write: each target says it cannot.
        proc = precompile_cli(
            "check", "--emit", "--format", "json", "src/shop/serving.py", cwd=root
        )
        assert proc.returncode == 1, proc.stderr
        document = json.loads(proc.stdout)
        refused = [f for f in document["findings"] if "cannot write" in f["message"]]
        targets = {f["target"] for f in refused}
        assert targets == {
            "shop.serving.clean",
            "shop.serving.with_gap",
            "shop.serving.stale",
        }, document["findings"]
        assert all("Read-only file system" in f["message"] for f in refused)
