"""Run the benchmarks and write bench/RESULTS.md.

    python bench/run.py [SECTION ...] [--runs N]      (or: make bench)

Each section writes bench/results/<section>.md; RESULTS.md is assembled from every
section file present, so re-running one section keeps the others' last results.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (
    cluster,
    daemon,
    dynamo,
    lsp,
    percall,
    real_models,
    scale,
    serving,
    shards,
    single_graph,
    surface,
)

HERE = Path(__file__).resolve().parent
SECTIONS: dict[str, Callable[[Path, int], str]] = {
    "single_graph_eager": single_graph.run_eager_section,
    "single_graph_inductor": single_graph.run_inductor_section,
    "dynamo": dynamo.run_dynamo_section,
    "real_models": real_models.run_real_models_section,
    "daemon": daemon.run_daemon_section,
    "lsp": lsp.run_lsp_section,
    "scale": scale.run_scale_section,
    "serving": serving.run_serving_section,
    "surface": surface.run_surface_section,
    "percall": percall.run_percall_section,
    "cluster": cluster.run_cluster_section,
    "shards": shards.run_shards_section,
}


#: Sections measured by a command of their own (an A/B between two source trees, which
#: run.py cannot check out), kept as written: bench/results/<name>.md.
RECORDED = (
    "restructure",
    "percall_epoch",
    "dynamo_percall",
    "percall_fx2",
    "dynamo_percall2",
    "percall_fx3",
    "dynamo_percall3",
    "percall_fx4",
    "percall_dyn4",
    "percall_dyn5",
)


def machine() -> str:
    import torch

    return f"Python {platform.python_version()}, torch {torch.__version__}, {platform.machine()}, {platform.processor() or 'cpu'}, {__import__('os').cpu_count()} cores"


def assemble() -> None:
    parts = [
        "# Benchmark results",
        "Reproduce with `make bench` (or `python bench/run.py [SECTION ...]`).",
    ]
    for name in (*SECTIONS, *RECORDED):
        path = HERE / "results" / f"{name}.md"
        if path.exists():
            parts.append(path.read_text().strip())
    (HERE / "RESULTS.md").write_text("\n\n".join(parts) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sections", nargs="*", choices=[*SECTIONS, []], default=list(SECTIONS))
    parser.add_argument(
        "--runs", type=int, default=5, help="fresh processes per measurement (median)"
    )
    args = parser.parse_args()
    (HERE / "results").mkdir(exist_ok=True)
    for name in args.sections or SECTIONS:
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as workdir:
            print(f"running {name} ...", flush=True)
            body = SECTIONS[name](Path(workdir), args.runs)
        command = f"python bench/run.py {name} --runs {args.runs}"
        (HERE / "results" / f"{name}.md").write_text(
            f"{body}\n\nMachine: {machine()}. Command: `{command}`.\n"
        )
        print(body, flush=True)
    assemble()


if __name__ == "__main__":
    main()
