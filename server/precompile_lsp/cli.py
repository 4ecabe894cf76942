"""The ``precompile`` command line.

Exit codes, as linters use them: 0 clean, 1 findings at or above ``--fail-on``, 2 a usage,
configuration or internal error. ``check`` imports neither torch nor pygls in this
process: captures run in worker processes.

This module parses the command line and dispatches; each subcommand lives with its kin
(``cli_check``: check and merge; ``cli_artifacts``: emit, verify, keygen, sign, inspect;
``cli_coverage``: coverage), and ``cli_workspace`` holds what they share.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from precompile_lsp import cli_artifacts, cli_check, cli_coverage
from precompile_lsp.cli_artifacts import INSPECT_LIMIT
from precompile_lsp.cli_workspace import (
    EXIT_ERROR,
    EXIT_OK,
    OutsideWorkspace,
    workspace_files,
    workspace_root,
)

__all__ = ["INSPECT_LIMIT", "build_parser", "main"]


def _daemon(args: argparse.Namespace) -> int:
    from precompile_lsp.config import ConfigError
    from precompile_lsp.daemon import run_daemon

    try:
        root = workspace_root(args.paths)
        return run_daemon(root, workspace_files(args.paths, root))
    except (ConfigError, FileNotFoundError, OutsideWorkspace) as error:
        print(f"precompile daemon: {error}", file=sys.stderr)
        return EXIT_ERROR


def _lsp(args: argparse.Namespace) -> int:
    from precompile_lsp.server import main as serve

    serve()
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="precompile",
        description="torch-precompile: capture once, serve anywhere; see graph breaks and coverage gaps.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check", help="check the workspace's @precompile.target functions (CI)"
    )
    check.add_argument(
        "paths", nargs="*", help="files or directories (default: the whole workspace)"
    )
    check.add_argument(
        "--format",
        choices=["text", "json", "sarif", "github"],
        default="text",
        help="report format: text for people, json for scripts, sarif for code scanning, "
        "github for workflow annotations (default: text)",
    )
    check.add_argument("--output", help="write the report here (atomically) instead of stdout")
    check.add_argument("--emit", action="store_true", help="also emit each target's artifact")
    check.add_argument(
        "--verify", action="store_true", help="also verify each artifact against eager"
    )
    check.add_argument(
        "--fail-on",
        choices=["error", "warning", "never"],
        default="error",
        help="exit 1 when a finding of this severity or worse is reported; never: always "
        "exit 0 unless the check itself fails (default: error)",
    )
    check.add_argument(
        "--fail-on-empty",
        action="store_true",
        help="exit 1 when no @precompile.target is found, so CI notices a check that checked "
        "nothing (default: exit 0 with a warning; also [tool.precompile] fail-on-empty)",
    )
    check.add_argument(
        "--jobs", type=int, help="worker processes (default: [tool.precompile] workers)"
    )
    check.add_argument(
        "--no-cache", action="store_true", help="ignore and do not write .precompile/cache"
    )
    check.add_argument(
        "--cache-dir",
        help="keep the result cache in this folder, e.g. one CI persists and shares between "
        "runners (default: [tool.precompile] cache-dir, else .precompile/cache)",
    )
    check.add_argument(
        "--shard",
        metavar="K/N",
        help="check only the K-th of N deterministic parts of the targets (1 <= K <= N); "
        "combine the N reports (--format json or sarif) with precompile merge",
    )
    check.add_argument(
        "--shard-balance",
        choices=["time", "count"],
        default="time",
        help="split by the capture times the result cache remembers (time; count when it "
        "remembers none) or by target count (default: time)",
    )
    check.add_argument("--quiet", action="store_true", help="no progress line on a terminal")
    check.set_defaults(run=cli_check.check)
    merge = commands.add_parser(
        "merge", help="one report, and check's exit code, from the reports of check --shard"
    )
    merge.add_argument("reports", nargs="+", metavar="REPORT", help="the N shard reports")
    merge.add_argument(
        "--format",
        choices=["text", "json", "sarif", "github"],
        help="report format (default: the reports' format; SARIF merges into SARIF only)",
    )
    merge.add_argument("--output", help="write the report here (atomically) instead of stdout")
    merge.add_argument(
        "--fail-on",
        choices=["error", "warning", "never"],
        default="error",
        help="exit 1 when a finding of this severity or worse is reported (default: error)",
    )
    merge.add_argument(
        "--fail-on-empty",
        action="store_true",
        help="exit 1 when the shards found no target (also when the shards were run with it)",
    )
    merge.set_defaults(run=cli_check.merge_reports)
    daemon = commands.add_parser("daemon", help="watch the workspace and print changed findings")
    daemon.add_argument(
        "paths", nargs="*", help="files or directories to watch (default: the whole workspace)"
    )
    daemon.set_defaults(run=_daemon)
    emit = commands.add_parser("emit", help="emit one target's artifact pair")
    emit.add_argument("target", help="module.function, function, or path.py::function")
    emit.add_argument("--quiet", action="store_true", help="no progress line on a terminal")
    emit.set_defaults(run=lambda a: cli_artifacts.emit_or_verify(a, "emit"))
    verify = commands.add_parser("verify", help="verify an artifact against eager")
    verify.add_argument("artifact", help="path of the artifact's .py file")
    verify.add_argument("--quiet", action="store_true", help="no progress line on a terminal")
    verify.add_argument(
        "--trusted-key",
        action="append",
        metavar="PUBLIC_KEY",
        help="first require a signature by this public key (repeatable)",
    )
    verify.add_argument(
        "--signature-only", action="store_true", help="check the signature, not against eager"
    )
    verify.set_defaults(run=cli_artifacts.verify_pair)
    keygen = commands.add_parser("keygen", help="make an Ed25519 key pair for signing artifacts")
    keygen.add_argument("key", help="private key file to create (written 0600)")
    keygen.add_argument("--public", help="public key file (default: KEY.pub)")
    keygen.set_defaults(run=cli_artifacts.keygen)
    sign = commands.add_parser("sign", help="sign an artifact pair (writes NAME.sig)")
    sign.add_argument("artifact", help="path of the artifact's .py file")
    sign.add_argument("--key", required=True, help="the Ed25519 private key file")
    sign.add_argument("--cache", help="the pair's cache (default: NAME.cache)")
    sign.add_argument("--signature", help="where to write the signature (default: NAME.sig)")
    sign.set_defaults(run=cli_artifacts.sign_pair)
    inspect = commands.add_parser("inspect", help="print an artifact's metadata without running it")
    inspect.add_argument("artifact", help="path of the artifact's .py file")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.add_argument(
        "--full",
        action="store_true",
        help=f"print values longer than {cli_artifacts.INSPECT_LIMIT} characters whole",
    )
    inspect.set_defaults(run=cli_artifacts.inspect_pair)
    coverage = commands.add_parser(
        "coverage",
        help="aggregate serving logs per target: served %%, refusal reasons, shadow mismatches",
    )
    coverage.add_argument(
        "logs", nargs="+", metavar="LOG", help="serving log files or globs (docs/serving.md)"
    )
    coverage.add_argument(
        "--format",
        choices=["text", "json", "sarif", "github"],
        default="text",
        help="report format (default: text)",
    )
    coverage.add_argument("--output", help="write the report here (atomically) instead of stdout")
    coverage.add_argument(
        "--max-refused",
        metavar="RATE",
        help="exit 1 when an artifact's refused share of calls is above RATE (0.05 or 5%%): "
        "a canary gate",
    )
    coverage.set_defaults(run=cli_coverage.coverage_report)
    lsp = commands.add_parser("lsp", help="run the language server over stdio")
    lsp.set_defaults(run=_lsp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0) and EXIT_ERROR
    if getattr(args, "jobs", None) is not None and args.jobs < 1:
        print("precompile check: --jobs must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
