"""Private names stay with their owner: ``make lint`` runs this.

Two rules, one idea (a leading underscore means "only my owner uses this"):

- **Private torch** (``torch._dynamo``, ``torch._C._set_grad_enabled``,
  ``torch.utils._pytree``) is named only in the ``precompile/_compat`` package, as code or
  as the text of the prelude an artifact's runtime binds them from. Those names change
  between torch releases without notice; keeping them in one package makes a torch upgrade
  one package's work.
- **The product's own private names** (``process._warm_up``, ``from .jobs import _x``)
  are named only in the module that defines them. A module's private names are its to
  change; another module that reaches in ties the two together where no interface says so.

import-linter cannot see attribute access, so this reads the code: each import and each
attribute read through an imported torch or product module. Text (messages, docstrings)
is not code and is not checked.

Usage: ``python tools/private_names.py [ROOT]``; exit status 1 lists each use.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

#: Each product package by its path and its import name.
PACKAGES = {"core/precompile": "precompile", "server/precompile_lsp": "precompile_lsp"}
#: The one package allowed to name private torch.
ALLOWED = "core/precompile/_compat/"


def _private(parts: list[str]) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts)


def _owner(module: str, level: int, package: str) -> str:
    """The absolute name of what ``from <level dots><module> import`` names in a module
    of ``package``."""
    if level == 0:
        return module
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _is_product(name: str) -> bool:
    return name.split(".")[0] in PACKAGES.values()


def _outsider(name: str, user: str) -> bool:
    """Whether module ``user`` names a private part of the dotted ``name`` from outside
    its owner: the part's owner is the prefix before it (``precompile._compat.x`` is
    ``precompile``'s to use, ``process._warm_up`` the ``process`` module's), and a module
    inside the owner may use it."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if _private([part]):
            owner = ".".join(parts[:i])
            return not (user == owner or user.startswith(owner + "."))
    return False


def uses(
    tree: ast.AST, module: str = "", check_torch: bool = True
) -> Iterator[tuple[int, str, str]]:
    """(line, name, whose) of each private torch name (when ``check_torch``; whose is
    ``"torch"``) and each private name of another product module (``"product"``) that
    ``tree``, the code of ``module`` (its dotted name), imports or reads."""
    package = module if module.endswith(".__init__") else module.rpartition(".")[0]
    module = module.removesuffix(".__init__")
    package = package.removesuffix(".__init__")
    torch_aliases: set[str] = set()
    #: product names bound in ``tree``: alias -> the dotted name it stands for
    product: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "torch":
                    if check_torch and _private(parts):
                        yield node.lineno, alias.name, "torch"
                    torch_aliases.add(alias.asname or "torch")
                elif _is_product(alias.name):
                    if _outsider(alias.name, module):
                        yield node.lineno, alias.name, "product"
                    bound = alias.name if alias.asname else parts[0]
                    product[alias.asname or parts[0]] = bound
        elif isinstance(node, ast.ImportFrom):
            owner = _owner(node.module or "", node.level, package)
            names = [a.name for a in node.names]
            if owner.split(".")[0] == "torch":
                if check_torch and (_private(owner.split(".")) or _private(names)):
                    yield node.lineno, f"from {node.module} import {', '.join(names)}", "torch"
            elif _is_product(owner):
                shown = "." * node.level + (node.module or "")
                for alias in node.names:
                    if _outsider(f"{owner}.{alias.name}", module):
                        yield node.lineno, f"from {shown} import {alias.name}", "product"
                    product[alias.asname or alias.name] = f"{owner}.{alias.name}"
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
        if not isinstance(inner, ast.Name):
            continue
        if check_torch and inner.id in torch_aliases and _private(chain):
            yield node.lineno, ".".join([inner.id, *chain]), "torch"
        elif inner.id in product and _outsider(".".join([product[inner.id], *chain]), module):
            yield node.lineno, ".".join([inner.id, *chain]), "product"


def check(root: Path) -> list[str]:
    problems = []
    for folder, name in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            module = ".".join([name, *path.relative_to(root / folder).with_suffix("").parts])
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
            for node in ast.walk(tree):
                for child in ast.iter_child_nodes(node):
                    child.parent = node  # type: ignore[attr-defined]  # marks outermost attributes
            torch_too = not relative.startswith(ALLOWED)
            for line, shown, whose in uses(tree, module, check_torch=torch_too):
                where = (
                    f"a private torch name outside {ALLOWED}; move it there"
                    if whose == "torch"
                    else "another module's private name; make it public there, or move the code"
                )
                problems.append(f"{relative}:{line}: {shown}: {where}")
    return problems


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    problems = check(root)
    for problem in problems:
        print(problem, file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
