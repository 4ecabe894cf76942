"""A serving log that is not a regular file (a FIFO with no reader: a log shipper that
is down) never blocks a call or the process exit: one warning, calls served."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import torch

from tests.fixtures import serving_models as m
from tests.harness import capture_pair, run_json


def test_a_fifo_serving_log_warns_once_and_blocks_nothing(tmp_path: Path) -> None:
    artifact, cache = capture_pair(m.add_one_, torch.randn(3), directory=tmp_path, name="add")
    fifo = tmp_path / "slog.fifo"
    os.mkfifo(fifo)
    code = textwrap.dedent(f"""
        import json, warnings
        import torch, precompile
        from tests.fixtures import serving_models as m
        warnings.simplefilter("ignore", precompile.ArtifactTrustWarning)
        caught = []
        warnings.showwarning = lambda message, category, *a, **k: caught.append(str(message))
        run = precompile.load({artifact!r}, {cache!r}, fallback=m.add_one_,
                              serving_log={str(fifo)!r})
        for _ in range(3):
            run(torch.randn(3))
            run.flush_serving_log()
        print(json.dumps({{"stats": run.stats(),
                           "warnings": [w for w in caught if "serving log" in w]}}))
    """)
    out = run_json(code, timeout=120)  # before the fix: never returned
    assert out["stats"]["served"] + out["stats"]["fallback"] == 3, out["stats"]
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "is not a regular file" in out["warnings"][0] or "No such device" in out["warnings"][0]
