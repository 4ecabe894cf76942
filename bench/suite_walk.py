"""How much make_fx's user-state walk costs in a process that imported every test module,
as a pytest worker does at collection (bench/RESULTS.md, "The test suite's time").

Run: ``python bench/suite_walk.py``. Prints the walk's time, the objects walked, and the
roots that contribute the most objects.
"""

from __future__ import annotations

import collections
import importlib
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    import torch
    from torch import nn

    from precompile.capturing.user_state import UserState, capture_roots

    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if "e2e" not in path.parts:
            importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))

    def step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(x)

    roots = capture_roots(step, (nn.Linear(2, 2), torch.randn(1, 2)))
    times = []
    for _ in range(5):
        started = time.perf_counter()
        state = UserState(roots)
        times.append(time.perf_counter() - started)
    print(
        f"walk: first {times[0] * 1e3:.0f} ms, best of 5 {min(times) * 1e3:.0f} ms; "
        f"{len(state.trail)} objects, {len(roots)} roots"
    )
    root_of: dict[int, str] = {}
    per_root: collections.Counter[str] = collections.Counter()
    for at, (parent, _value, key) in enumerate(state.trail):
        root_of[at] = str(key) if parent < 0 else root_of[parent]
        per_root[root_of[at]] += 1
    for name, count in per_root.most_common(10):
        print(f"{count:6d} {name}")


if __name__ == "__main__":
    main()
