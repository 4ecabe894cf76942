"""What "this function's code changed" means, decided the same way everywhere.

A capture records a digest of every function it ran through; a load compares them with
the live sources, and the language server compares them with the workspace to call an
artifact stale. All three use this module, so they agree: the digest covers exactly one
function -- from its first decorator to its last line, dedented -- found by qualified
name, so an edit elsewhere in the file (another function, a comment, lines added above)
does not change it.

Imports nothing at module level and nothing but the standard library inside: artifacts
carry these functions verbatim, and the language server imports them without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: artifacts carry these functions without the names
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any


def decode_source(data: bytes) -> str | None:
    """A module file's bytes as the text Python compiles and ``inspect.getsource``
    reads (what a capture recorded): in the encoding its BOM or coding cookie declares,
    UTF-8 otherwise, the BOM dropped, ``\r\n`` and ``\r`` read as ``\n``. None where it
    does not decode. Read as plain UTF-8, a Windows checkout's CRLF file differed in every
    function, and a BOM made every function gone."""
    import io
    import tokenize

    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def parse_module(module_text: str) -> Any:
    """``ast.parse(module_text)``, or None where it does not parse: what
    ``function_source`` searches. A caller looking up several functions of one module
    parses it once (a long module takes milliseconds, a huge one seconds). A text nested
    deeper than the parser reaches (thousands of ``elif`` branches: a RecursionError, or
    CPython's "parser stack overflowed" MemoryError) does not parse either, as Python
    could not import it."""
    import ast

    try:
        return ast.parse(module_text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def scope_statements(body: list[Any]) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """Each statement of ``body`` that runs in its own scope, in source order, with the
    compound statements it sits in, outermost first: the blocks of ``if``, ``try``,
    ``with``, ``for``, ``while`` and ``match`` entered (``if FAST: def f`` and ``try: ...
    except ImportError: def f`` define f in the module), a function's or class's body
    not. A stack, not recursion: an ``elif`` chain nests one block per branch, and a
    generated module's thousands of branches must not exhaust the recursion limit."""
    import ast

    stack: list[tuple[Iterator[Any], tuple[Any, ...]]] = [(iter(body), ())]
    while stack:
        pending, around = stack[-1]
        stmt = next(pending, None)
        if stmt is None:
            stack.pop()
            continue
        yield stmt, around
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        blocks = [getattr(stmt, field, None) for field in ("body", "orelse", "finalbody")]
        blocks += [handler.body for handler in getattr(stmt, "handlers", [])]
        blocks += [case.body for case in getattr(stmt, "cases", [])]
        blocks = [b for b in blocks if isinstance(b, list) and b and isinstance(b[0], ast.stmt)]
        if blocks:
            inner = (*around, stmt)
            stack += [(iter(block), inner) for block in reversed(blocks)]


def function_node(tree: Any, qualname: str, line: int = 0) -> Any:
    """The definition (or lambda) of the function ``qualname`` (``Cls.method``,
    ``f.<locals>.g``) in the module ``tree``; None when it has no such function.
    ``line`` (the function's first line at capture) picks among same-named definitions,
    and places a lambda."""
    import ast

    path = [part for part in qualname.split(".") if part != "<locals>"]
    scopes: list[list[ast.stmt]] = [tree.body]
    # Definitions and lambdas: statements and expressions, both with line numbers.
    found: list[ast.stmt | ast.expr] = []
    for depth, name in enumerate(path):
        matches: list[ast.stmt | ast.expr] = []
        for body in scopes:
            for stmt, _around in scope_statements(body):
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    if stmt.name == name:
                        matches.append(stmt)
        if name == "<lambda>" and depth == len(path) - 1:
            # Every lambda of the scope: the nearest to ``line`` is picked below, so
            # lines added above it do not lose it.
            for body in scopes:
                matches.extend(_scope_lambdas(body))
        if not matches:
            return None
        found = matches
        scopes = [
            getattr(m, "body", []) for m in matches if isinstance(getattr(m, "body", None), list)
        ]
    if not found:
        return None
    return min(found, key=lambda n: (abs(_first_line(n) - line) if line else 0))


def _scope_lambdas(body: list[Any]) -> list[Any]:
    """The lambdas whose qualified name is the scope's ``<lambda>``: in its statements,
    and in what its definitions evaluate there (decorators, defaults, bases), not in
    the bodies of its functions, classes and lambdas (their own scopes)."""
    import ast

    found = []
    stack: list[Any] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(node, ast.Lambda):
                found.append(node)
            else:
                stack.extend(node.decorator_list)
            stack.extend(node.args.defaults)
            stack.extend(d for d in node.args.kw_defaults if d is not None)
        elif isinstance(node, ast.ClassDef):
            stack.extend([*node.decorator_list, *node.bases, *(k.value for k in node.keywords)])
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


def _first_line(node: Any) -> int:
    """A definition's first line: its first decorator's."""
    decorators = getattr(node, "decorator_list", [])
    return int(min([d.lineno for d in decorators] + [node.lineno]))


def source_lines(text: str) -> list[str]:
    """``text``'s lines with their ends, split where Python's line numbers split them
    (``\r\n``, ``\r``, ``\n``): ``str.splitlines`` also splits at a form feed and other
    separators, which shifted every line below one (a ``^L`` page break) out of a
    function's digest."""
    import re

    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z", text)


def function_source(module_text: str, qualname: str, line: int = 0, tree: Any = None) -> str | None:
    """The source of the function ``qualname`` in ``module_text`` (``function_node``,
    ``node_source``); None when the text has no such function (or does not parse).
    ``tree``: ``parse_module(module_text)``, where the caller has it."""
    if tree is None:
        tree = parse_module(module_text)
    node = None if tree is None else function_node(tree, qualname, line)
    return None if node is None else node_source(module_text, node)


def node_source(module_text: str, node: Any) -> str:
    """A definition's text in ``module_text``, from its first decorator to its last line,
    dedented; a lambda's own expression."""
    import ast
    import textwrap

    text = "".join(source_lines(module_text)[_first_line(node) - 1 : node.end_lineno])
    if isinstance(node, ast.Lambda):
        text = ast.get_source_segment(module_text, node) or text
    return textwrap.dedent(text)


def source_digest(text: str) -> str:
    """The digest recorded for a function's source (sha256 of its UTF-8 text)."""
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def changed_functions(
    records: Iterable[dict[str, Any]], module_text: Callable[[str, str], str | None]
) -> Iterator[tuple[dict[str, Any], bool]]:
    """Yield ``(record, gone)`` for each of ``records`` (``FUNCTION_SOURCES`` rows) whose
    function's live source differs from the digest recorded at capture; ``gone`` when the
    function is not found at all. ``module_text(module, path)`` reads a module's live
    text (None when it cannot), once per module."""
    texts: dict[tuple[str, str], str | None] = {}
    digests: dict[tuple[str, str], str] = {}
    trees: dict[tuple[str, str], Any] = {}
    for record in records:
        key = (record["module"], record["path"])
        if key not in texts:
            texts[key] = module_text(*key)
        text = texts[key]
        if text is not None and "module_sha256" in record:
            # A module whose text is as captured holds every function as captured: the
            # digest of the whole text stands in for parsing it (seconds on a big file).
            if key not in digests:
                digests[key] = source_digest(text)
            if digests[key] == record["module_sha256"]:
                continue
        if text is not None and key not in trees:
            trees[key] = parse_module(text)
        source = (
            None
            if text is None or trees[key] is None
            else function_source(text, record["function"], record.get("line", 0), trees[key])
        )
        if source is None or source_digest(source) != record["sha256"]:
            yield record, source is None


def changed_function_message(record: dict[str, Any], gone: bool, consequence: str) -> str:
    """The refusal of an artifact one of whose ``changed_functions`` changed: where the
    function is, what happened to it, what that means for this artifact
    (``consequence``), and the fix."""
    return (
        f"precompile: {record['function']} ({record['path']}:{record['line']}, module "
        f"{record['module']}) {'is gone or renamed' if gone else 'changed'} since this "
        f"artifact was captured; {consequence}. Capture it again (re-emit the artifact)"
    )
