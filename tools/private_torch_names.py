"""Only the compat module names private torch: ``make lint`` runs this.

Private torch names (``torch._dynamo``, ``torch._C._set_grad_enabled``,
``torch.utils._pytree``) change between torch releases without notice. Keeping every one
of them in the ``precompile/_compat`` package -- as code, or as the text of the prelude an
artifact's runtime binds them from -- makes a torch upgrade one file's work. This finds
any other module that imports a private torch module or reads a private attribute of
torch; import-linter cannot see attribute access. Text (messages, docstrings) is not
code and is not checked.

Usage: ``python tools/private_torch_names.py [ROOT]``; exit status 1 lists each use.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("core/precompile", "server/precompile_lsp")
#: The one package allowed to name private torch.
ALLOWED = "core/precompile/_compat/"


def _private(parts: list[str]) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts)


def uses(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, name) of each private torch name ``tree`` imports or reads."""
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "torch":
                    if _private(parts):
                        yield node.lineno, alias.name
                    aliases.add(alias.asname or "torch")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "torch":
                names = [a.name for a in node.names]
                if _private(parts) or _private(names):
                    yield node.lineno, f"from {node.module} import {', '.join(names)}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or isinstance(
            getattr(node, "parent", None), ast.Attribute
        ):
            continue
        chain: list[str] = []
        inner: ast.expr = node
        while isinstance(inner, ast.Attribute):
            chain.insert(0, inner.attr)
            inner = inner.value
        if isinstance(inner, ast.Name) and inner.id in aliases and _private(chain):
            yield node.lineno, ".".join([inner.id, *chain])


def check(root: Path) -> list[str]:
    problems = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative.startswith(ALLOWED):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
            for node in ast.walk(tree):
                for child in ast.iter_child_nodes(node):
                    child.parent = node  # type: ignore[attr-defined]  # marks outermost attributes
            problems += [f"{relative}:{line}: {name}" for line, name in uses(tree)]
    return problems


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    problems = check(root)
    for problem in problems:
        print(f"{problem}: a private torch name outside {ALLOWED}; move it there", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
