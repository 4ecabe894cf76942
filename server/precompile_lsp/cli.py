"""The ``precompile`` command line. Exit codes: 0 clean, 1 findings, 2 usage or error."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def _inspect(args: argparse.Namespace) -> int:
    from precompile.errors import PrecompileError
    from precompile.metadata import inspect_artifact

    try:
        metadata = inspect_artifact(args.artifact)
    except PrecompileError as error:
        print(f"precompile inspect: {error}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(metadata, indent=2, default=list))
    else:
        width = max(map(len, metadata), default=0)
        for key, value in metadata.items():
            print(f"{key.ljust(width)}  {value!r}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="precompile", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="print an artifact's metadata without running it")
    inspect.add_argument("artifact", help="path of the artifact's .py file")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(run=_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0) and EXIT_ERROR
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
