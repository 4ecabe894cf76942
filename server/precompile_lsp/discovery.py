"""Find ``@precompile.target`` functions by reading source with ``ast``; never import it.

Every import spelling counts: ``import precompile`` (``@precompile.target``), ``import
precompile as pc`` (``@pc.target``), ``from precompile import target [as mark]``, and the
same from ``precompile.targets``. Only module-level functions can be targets (a worker
imports them by name); a target on a method or nested function, and a file that does not
parse, become findings in that file instead of crashes.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from precompile_lsp.files import MAX_SOURCE_BYTES, SourceRead, read_source
from precompile_lsp.findings import Finding, Span

if TYPE_CHECKING:
    from precompile_lsp.config import Config

_MODULES = ("precompile", "precompile.targets")


@dataclasses.dataclass(frozen=True)
class TargetDecl:
    """A discovered target: where it is, and its options where they are literals."""

    file: Path
    module: str
    function: str
    decorator: Span
    definition: Span  # the ``def name`` header
    options: dict[str, Any]
    #: The function's last line: the target spans decorator..end_line (an editor asks
    #: for the target "at the cursor" anywhere in it).
    end_line: int = 0

    @property
    def key(self) -> str:
        return f"{self.module}.{self.function}"


def _codepoints(lines: list[str], line: int, byte_col: int) -> int:
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    return len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


def _span(lines: list[str], node: ast.expr) -> Span:
    return Span(
        node.lineno,
        _codepoints(lines, node.lineno, node.col_offset),
        node.end_lineno or node.lineno,
        _codepoints(lines, node.end_lineno or node.lineno, node.end_col_offset or node.col_offset),
    )


def _decorator_span(lines: list[str], node: ast.expr) -> Span:
    """A decorator from its ``@`` (ast starts it at the expression after it)."""
    span = _span(lines, node)
    text = lines[span.line - 1] if span.line <= len(lines) else ""
    at = text.rfind("@", 0, span.column + 1)
    return (
        Span(span.line, at, span.end_line, span.end_column)
        if at >= 0 and not text[at + 1 : span.column].strip()
        else span
    )


def _def_header(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> Span:
    """From ``def`` to the end of the function's name."""
    start = _codepoints(lines, node.lineno, node.col_offset)
    text = lines[node.lineno - 1]
    name_at = text.find(node.name, start)
    end = name_at + len(node.name) if name_at >= 0 else len(text.rstrip())
    return Span(node.lineno, start, node.lineno, end)


class _Spellings(ast.NodeVisitor):
    """The names under which this file can reach ``precompile.target``."""

    def __init__(self) -> None:
        self.modules: set[str] = set()  # names bound to the precompile (or .targets) module
        self.functions: set[str] = set()  # names bound to the target function itself

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in _MODULES:
                if alias.asname:
                    self.modules.add(alias.asname)
                else:
                    self.modules.add(alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module in _MODULES:
            for alias in node.names:
                if alias.name == "target":
                    self.functions.add(alias.asname or "target")
                elif alias.name == "targets" and node.module == "precompile":
                    self.modules.add(alias.asname or "targets")


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _is_target(decorator: ast.AST, spellings: _Spellings) -> bool:
    func = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = _dotted(func)
    if name is None:
        return False
    if name in spellings.functions:
        return True
    head, _, tail = name.rpartition(".")
    return tail == "target" and (
        head in spellings.modules or head in ("precompile", "precompile.targets")
    )


def _literal_options(call: ast.AST) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if not isinstance(call, ast.Call):
        return options
    for keyword in call.keywords:
        if keyword.arg in ("backend", "tracer", "artifact", "training", "resources"):
            try:
                options[keyword.arg] = ast.literal_eval(keyword.value)
            except ValueError:
                options[keyword.arg] = None  # not a literal: the worker reads the real value
    options["has_examples"] = bool(call.args) or any(k.arg == "examples" for k in call.keywords)
    options["has_covers"] = any(k.arg == "covers" for k in call.keywords)
    return options


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


def unreadable_findings(read: SourceRead) -> list[Finding]:
    """Findings for a source that could not be searched for targets at all: one too big
    to parse that mentions ``precompile`` (PC005), one that is not text in its encoding
    (PC002, as a file that does not parse). Either would otherwise pass a check unseen."""
    path = read.path
    if read.too_big and read.may_hold_targets:
        return [
            Finding(
                code="PC005",
                message=f"{path.name} is {_mib(read.size)} ({read.size} bytes), over the "
                f"{_mib(MAX_SOURCE_BYTES)} limit of files searched for targets, and it mentions "
                f"precompile: any @precompile.target in it is not checked. Move the targets "
                f"into a smaller module (generated code or data can stay in a module they "
                f"import), or exclude this file in [tool.precompile] exclude if it holds none",
                file=path,
                span=Span.at(1, 0, 1),
            )
        ]
    problem = read.decode_error
    if problem is None or path.suffix != ".py":
        return []
    return [
        Finding(
            code="PC002",
            message=f"cannot read this file for precompile targets: it is not valid "
            f"{problem.encoding} (byte 0x{problem.byte:02x} at offset {problem.offset}, line "
            f"{problem.line}: {problem.reason}). Save it as UTF-8, or declare its encoding on "
            f"its first or second line, e.g. # -*- coding: latin-1 -*-",
            file=path,
            span=Span.at(problem.line, problem.column, 1),
        )
    ]


def discover(path: Path, source: str, module: str | None) -> tuple[list[TargetDecl], list[Finding]]:
    """The targets of one file, and the findings discovery itself raises there."""
    lines = source.splitlines()
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as error:
        line = error.lineno or 1
        column = max((error.offset or 1) - 1, 0)
        return [], [
            Finding(
                code="PC002",
                message=f"cannot read this file for precompile targets: {error.msg}",
                file=path,
                span=Span(
                    line,
                    _codepoints(lines, line, column),
                    line,
                    _codepoints(lines, line, column) + 1,
                ),
            )
        ]
    spellings = _Spellings()
    spellings.visit(tree)
    if not (spellings.modules or spellings.functions) and "precompile" not in source:
        return [], []
    targets, findings = [], []

    def visit(body: list[ast.stmt], where: str | None) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    if not _is_target(decorator, spellings):
                        continue
                    if where is not None:
                        findings.append(
                            Finding(
                                code="PC003",
                                message=f"@precompile.target on {where} {node.name!r} is ignored: only "
                                "module-level functions can be targets (a worker imports them by name). "
                                "Move it to module level, taking the module as an argument",
                                file=path,
                                span=_decorator_span(lines, decorator),
                            )
                        )
                        continue
                    options = _literal_options(decorator)
                    if not options.get("has_examples"):
                        findings.append(
                            Finding(
                                code="PC004",
                                message="@precompile.target needs examples: a zero-argument function "
                                "returning the calls to capture, e.g. @precompile.target(make_examples)",
                                file=path,
                                span=_decorator_span(lines, decorator),
                            )
                        )
                        continue
                    if module is None:
                        findings.append(
                            Finding(
                                code="PC004",
                                message=f"{path.name} is not under a source root, so a worker cannot import "
                                "it; add its directory to [tool.precompile] source-roots",
                                file=path,
                                span=_decorator_span(lines, decorator),
                            )
                        )
                        continue
                    targets.append(
                        TargetDecl(
                            path,
                            module,
                            node.name,
                            _decorator_span(lines, decorator),
                            _def_header(lines, node),
                            options,
                            node.end_lineno or node.lineno,
                        )
                    )
                visit(node.body, "nested function")
            elif isinstance(node, ast.ClassDef):
                visit(node.body, "method")
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, []) or [], where)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body, where)

    visit(tree.body, None)
    return targets, findings


def scan(
    paths: list[Path], config: Config
) -> list[tuple[SourceRead, list[TargetDecl], list[Finding]]]:
    """Read and parse ``paths`` for targets: each file as read, its targets, and its
    findings (an unreadable or undecodable file is a finding where the workspace
    includes it). Thread-safe: it reads files and changes nothing."""
    scanned: list[tuple[SourceRead, list[TargetDecl], list[Finding]]] = []
    for path in paths:
        read = read_source(path)
        if read.text is None or not config.is_included(path):
            unread = unreadable_findings(read) if config.is_included(path) else []
            scanned.append((read, [], unread))
            continue
        targets, findings = discover(path, read.text, config.module_of(path))
        scanned.append((read, targets, findings))
    return scanned
