"""The module-level statements a captured function's code reads: its globals' bindings.

An artifact records a digest of each function its capture ran through
(``runtime.source_digest``), so an edit to one is seen as stale. A function also reads
names bound outside it -- ``K = 2.0`` at the top of its module, a class attribute
``Cfg.HIDDEN``, ``config.SCALE`` of a project module it imported -- and the capture
specialised on their values. Serving checks those values per call and refuses a call
they no longer match, but the language server, which never imports the workspace, would
still call the artifact current. So each function record carries, per module, the names
the function reads there and a digest of the statements that bind them (this module),
and the workspace compares them as it compares the functions' own digests.

What counts as a read, from the function's source: every name it loads that no scope
of its own binds (a nested function's parameter shadows a global only inside it), and
every ``name.attr`` whose ``name`` is a class of the same module (its body's bindings of
``attr``), a project module the function's globals hold (that module's bindings of
``attr``, and along ``name.sub.attr`` the submodule's; resolved at capture, where the
module is live) or an instance of a project class (the class body's: a dataclass's
defaults), and a name the module imports from a project module (``from .helper import
K``: the helper's bindings of ``K``, hop by hop). A name spelled as a string constant
counts as spelled out (``getattr(helper, "K")``, ``vars(helper)["K"]``,
``globals()["K"]``), ``self.__class__.k`` and ``super().k`` as ``self.k``; a class
attribute's digest covers the class's header and a decorator, metaclass or base's
``__init_subclass__`` defined beside it.
The binding statements are the
module's top-level ones (inside ``if``/``try``/``with``/``for`` blocks too). A function or
class definition that binds a name read itself counts only as binding it (a ``def``
added after an import of the name): a function the capture ran through has its own
record, and an edit to one it did not run changes nothing it computed. One a value was
made with counts whole (``K = compute()``: compute's body ran at import, and the
capture specialised on its result). An attribute a class body does not bind is the
instance's: the methods that set it on ``self`` count whole (``self.k = k`` in
``__init__``, with its default and decorators; ``setattr``, ``vars(self)[...]``,
``self.__dict__``, ``type(self).k``), and so they do where the body binds it too.
A definition's body is followed as its module resolves it (its parameters and locals
are not globals; one in a class body reads the module's names, not the class's). A
statement that changes a global's object in place (``CFG.update(...)``) counts as
binding it, where not only an import binds the name.

Imports nothing but the standard library and ``runtime.source_digest``, whose meaning of
"changed" it extends: the language server reads this without torch. Not carried by
artifacts (a load checks the values themselves).
"""

from __future__ import annotations

import ast
import builtins
import collections
import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

from precompile.runtime.source_digest import (
    parse_module,
    scope_statements,
    source_digest,
    source_lines,
)

T = TypeVar("T")

#: The statements that bind a name to a function or class they define.
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

#: Where a name a binding reads is looked up: the module's globals; the class scope
#: first (a name loaded in a class body: a method's default, decorator); an attribute
#: read through the instance (``self.dim`` in a method counted whole: what the class's
#: methods set on it, then its body; never a module global). ``False``/``True`` are the
#: first two.
_Where = int
_INSTANCE: _Where = 2


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` that run in its own scope (``scope_statements``)."""
    return (stmt for stmt, _around in scope_statements(body))


def _bound(stmt: ast.stmt) -> set[str]:
    """The names a simple statement binds in its scope (a compound one: its header's; a
    function or class definition: its name, and the globals a function declares)."""
    if isinstance(stmt, _DEFINITIONS):
        # A function declaring a global binds it when it runs (``def setup(): global K``).
        declared = [n for n in ast.walk(stmt) if isinstance(n, ast.Global)]
        return {stmt.name, *(name for n in declared for name in n.names)}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        targets = [stmt.target]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    names = {name for t in targets for name in _target_names(t)}
    if isinstance(stmt, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
        return names
    # A walrus at the statement's own level binds in this scope too: in a compound
    # statement's header only (its blocks' statements are binders of their own; walking
    # them from every enclosing ``if`` of an ``elif`` chain made the walk quadratic).
    names |= _call_bindings(stmt)
    if isinstance(stmt, (ast.If, ast.While)):
        header: list[ast.AST] = [stmt.test]
    elif isinstance(stmt, ast.Match):
        header = [stmt.subject]
    elif isinstance(stmt, (ast.Try, ast.TryStar)):
        header = [h.type for h in stmt.handlers if h.type is not None]
    else:
        header = [stmt]
    names |= {
        n.target.id
        for part in header
        for n in ast.walk(part)
        if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name)
    }
    return names


def _target_names(target: ast.expr) -> set[str]:
    """The names an assignment to ``target`` binds or changes: a name, each of a
    tuple's or list's, and the object a subscript or attribute store writes into
    (``NAMES[K] = v`` changes NAMES, not K; ``Cfg.X = v`` changes Cfg)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return {name for elt in target.elts for name in _target_names(elt)}
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    if isinstance(target, ast.Attribute) and _this_module(target.value):
        return {target.attr}  # ``sys.modules[__name__].K = v``
    if isinstance(target, ast.Subscript) and _namespace_call(target.value):
        # ``globals()["K"] = v`` (or ``vars()``) at a module's level binds K.
        key = target.slice
        return (
            {key.value} if isinstance(key, ast.Constant) and isinstance(key.value, str) else set()
        )
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        value = target.value
        while isinstance(value, (ast.Subscript, ast.Attribute)):
            value = value.value
        return {value.id} if isinstance(value, ast.Name) else set()
    return set()


def _namespace_call(node: ast.expr) -> bool:
    """``globals()`` or ``vars()``: the namespace of the scope they are called in."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("globals", "vars")
        and not node.args
        and not node.keywords
    )


def _this_module(node: ast.expr) -> bool:
    """``sys.modules[...]``: a module, the one whose text this is as far as a binding of
    its globals goes (another one's is only a needless stale)."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "modules"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "sys"
    )


def _keys(node: ast.expr | None) -> set[str]:
    """The constant string keys of a name or dict literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Dict):
        return {
            k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
    return set()


def _call_bindings(stmt: ast.stmt) -> set[str]:
    """The globals a call statement may bind by name: ``setattr(holder, "K", v)`` (the
    holder may be the module: ``sys.modules[__name__]``; where it is another object, an
    edit of it is only a needless stale), ``globals().update(K=v)`` or
    ``update({"K": v})``, ``globals().__setitem__("K", v)`` and ``setdefault``."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not isinstance(call, ast.Call):
        return set()
    func = call.func
    if isinstance(func, ast.Name) and func.id == "setattr" and len(call.args) == 3:
        return _keys(call.args[1])
    if not (isinstance(func, ast.Attribute) and _namespace_call(func.value)):
        return set()
    first = call.args[0] if call.args else None
    if func.attr == "update":
        return _keys(first) | {k.arg for k in call.keywords if k.arg is not None}
    if func.attr in ("__setitem__", "setdefault"):
        return _keys(first)
    return set()


@functools.lru_cache(maxsize=16)
def _lines(text: str) -> list[str]:
    """``source_lines(text)``, once per text: ``ast.get_source_segment`` splits the
    whole module again, character by character, at each call."""
    return source_lines(text)


def _segment(text: str, node: ast.AST) -> str:
    """``ast.get_source_segment(text, node) or ""``, from ``_lines``."""
    end_line, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
    if end_line is None or end_col is None or not hasattr(node, "lineno"):
        return ""
    lines = _lines(text)
    first, last, col = node.lineno - 1, end_line - 1, getattr(node, "col_offset", 0)
    if first == last:
        return lines[first].encode()[col:end_col].decode()
    head = lines[first].encode()[col:].decode()
    return "".join([head, *lines[first + 1 : last], lines[last].encode()[:end_col].decode()])


def _header(stmt: ast.stmt, text: str) -> str:
    """A statement's own text, without a comment after it; of a ``for`` or ``with``, its
    header's lines (its block's statements are bindings of their own); of a definition,
    its decorators' too."""
    body = getattr(stmt, "body", None)
    if isinstance(stmt, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)) and body:
        return "".join(_lines(text)[stmt.lineno - 1 : body[0].lineno - 1])
    if isinstance(stmt, _DEFINITIONS) and stmt.decorator_list:
        decorators = [_segment(text, d) for d in stmt.decorator_list]
        return "\n".join(["@" + d for d in decorators] + [_segment(text, stmt)])
    return _segment(text, stmt)


def _binding_text(stmt: ast.stmt, name: str, text: str) -> str:
    """What of ``stmt`` binds ``name``: of an import, the one alias that binds it
    (``from .helper import scale`` of ``from .helper import scale, OTHER``; ``import
    torch`` of ``import torch.utils.data``, which binds the same package), so importing
    another name beside it changes nothing; of any other statement, its header."""
    if isinstance(stmt, ast.ImportFrom):
        for alias in stmt.names:
            if (alias.asname or alias.name) == name:
                source = "." * stmt.level + (stmt.module or "")
                return f"from {source} import {alias.name}" + (
                    f" as {alias.asname}" if alias.asname else ""
                )
    elif isinstance(stmt, ast.Import):
        for alias in stmt.names:
            if alias.asname == name:
                return f"import {alias.name} as {alias.asname}"
            if not alias.asname and alias.name.split(".")[0] == name:
                return f"import {name}"
    return _header(stmt, text)


def _changed_in_place(stmt: ast.stmt) -> set[str]:
    """The names whose object a statement that binds nothing changes in place: a call of
    a method along a name (``CFG.update(gain=3.0)``, ``REGISTRY.append(f)``),
    ``setattr``/``delattr`` of one (``setattr(CFG, "gain", 3.0)``), and ``del`` of an
    item or attribute (``del CFG["gain"]``: ``del K`` unbinds K); of a function, the
    globals its body changes so (``def fill(): REGISTRY["a"] = 1.0``)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        changed: set[str] = set()
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                changed |= {
                    name
                    for t in targets
                    if isinstance(t, (ast.Subscript, ast.Attribute))
                    for name in _target_names(t)
                }
            elif isinstance(node, (ast.Delete, ast.Expr)):
                changed |= _changed_in_place(node)
        return changed & _free_names(stmt, frozenset()) if changed else changed
    if isinstance(stmt, ast.Delete):
        return {name for target in stmt.targets for name in _target_names(target)}
    if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
        return set()
    call = stmt.value
    if isinstance(call.func, ast.Attribute):
        return _target_names(call.func)
    if isinstance(call.func, ast.Name) and call.func.id in ("setattr", "delattr") and call.args:
        held = call.args[0]
        return {held.id} if isinstance(held, ast.Name) else _target_names(held)
    return set()


#: What was built of the scope bodies read lately (``_remembered``): by what, the body's
#: identity and a key, the body itself (so its identity is not reused while it is here)
#: and the result.
_REMEMBERED: dict[tuple[Callable[..., Any], int, str], tuple[list[ast.stmt], Any]] = {}


def _remembered(build: Callable[[list[ast.stmt], str], T], body: list[ast.stmt], key: str) -> T:
    """``build(body, key)``, once for the bodies read lately: a capture and a staleness
    check digest many names of one module, one call each, and a scope's binders (every
    function's body walked) or a class's stores (every method's) do not change between
    them."""
    hit = _REMEMBERED.get((build, id(body), key))
    if hit is not None and hit[0] is body:
        return cast(T, hit[1])
    if len(_REMEMBERED) >= 64:
        _REMEMBERED.clear()
    built = build(body, key)
    _REMEMBERED[(build, id(body), key)] = (body, built)
    return built


def _binders(body: list[ast.stmt]) -> dict[str, list[ast.stmt]]:
    """``_scope_binders(body)``, remembered."""
    return _remembered(_scope_binders, body, "")


def _scope_binders(body: list[ast.stmt], _key: str = "") -> dict[str, list[ast.stmt]]:
    """Name -> the statements of ``body``'s scope that bind it, in order, function and
    class definitions included (``binding_digests`` says what of them counts); and
    those that change a bound object in place (``_changed_in_place``), where something
    other than an import binds the name: ``CFG.update(...)`` after ``CFG = {...}``
    changes what a read of CFG finds, ``torch.manual_seed(0)`` is not a binding of
    torch (every function reading torch would be stale with each such line)."""
    statements = [(stmt, _bound(stmt)) for stmt in _statements(body)]
    assigned = {
        name
        for stmt, bound in statements
        if not isinstance(stmt, (ast.Import, ast.ImportFrom))
        for name in bound
    }
    in_place = {id(stmt): _changed_in_place(stmt) for stmt, _bound_names in statements}
    # A call of one of this scope's functions changes what that function changes
    # (``fill()`` at import, filling REGISTRY).
    changers = {
        stmt.name: in_place[id(stmt)]
        for stmt, _bound_names in statements
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    found: dict[str, list[ast.stmt]] = {}
    for stmt, bound in statements:
        changed = in_place[id(stmt)]
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            func = stmt.value.func
            if isinstance(func, ast.Name):
                changed = changed | changers.get(func.id, set())
        for name in sorted(bound | {n for n in changed if n in assigned}):
            found.setdefault(name, []).append(stmt)
    return found


def _instance_stores(body: list[ast.stmt], name: str, owner: str) -> list[ast.stmt]:
    """The methods of a class body (``body``) that set the attribute ``name`` through
    their first parameter or the class's own name ``owner`` (a staticmethod's ``Net.k =
    v``; ``_stored_names``), or hand values to a base's method, which may set it
    (``super().__init__(k=2.0)``: ``_hands_to_base``)."""
    methods = _remembered(_method_stores, body, owner)
    return [method for method, stored in methods if name in stored or _ANY in stored]


def _method_stores(body: list[ast.stmt], owner: str) -> list[tuple[ast.stmt, set[str]]]:
    """Each method of a class body with the attributes it sets (``_instance_stores``;
    ``_ANY`` for any), built once per class, not per attribute: a long class read for
    many attributes walked every method again for each."""
    methods: list[tuple[ast.stmt, set[str]]] = []
    for method in _statements(body):
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = _first_parameter(method)
        stored: set[str] = set()
        for node in ast.walk(method):
            if first:
                stored |= _stored_names(node, first)
                if _hands_to_base(node, first):
                    stored.add(_ANY)
            if owner:
                stored |= _stored_names(node, owner)
        if stored:
            methods.append((method, stored))
    return methods


def _hands_to_base(node: ast.AST, first: str) -> bool:
    """Whether ``node`` calls a base's method on the instance ``first`` with values:
    ``super().__init__(k=2.0)``, ``Base.__init__(self, 2.0)``. The base's row records
    what its method sets; the values this class passes are here."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    owner = node.func.value
    if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name):
        return owner.func.id == "super" and bool(node.args or node.keywords)
    return (
        isinstance(owner, ast.Name)
        and owner.id != first
        and bool(node.args)
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == first
        and len(node.args) + len(node.keywords) > 1
    )


def _first_parameter(function: ast.AST) -> str:
    """The name of a function's or lambda's first positional parameter (``self``,
    ``cls``); "" for anything else."""
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return ""
    positional = function.args.posonlyargs + function.args.args
    return positional[0].arg if positional else ""


def _spelled_reads(top: ast.AST, first: str) -> Iterator[tuple[ast.AST, str, list[str]]]:
    """Each attribute read in ``top`` however spelled (``_attribute_chain``,
    ``_named_read``), as ``(node, root, path)``."""
    for node in ast.walk(top):
        if isinstance(node, ast.Attribute):
            found = _attribute_chain(node, first)
        elif isinstance(node, (ast.Call, ast.Subscript)):
            found = _named_read(node, first)
        else:
            continue
        if found is not None:
            yield node, *found


def _instance_reads(method: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The attributes a method reads through its first parameter, however spelled
    (``self.dim``, ``self._make_k()``, ``type(self).K``, ``self.__class__.K``,
    ``getattr(self, "K")``: ``function_reads``'s spellings), sorted."""
    first = _first_parameter(method)
    if not first:
        return []
    return sorted(
        {
            path[0]
            for node, root, path in _spelled_reads(method, first)
            if root == first
            and path
            and not (isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load))
        }
    )


#: In ``_stored_names``: a store whose attribute name is computed, so any.
_ANY = "*"


def _stores_attribute(node: ast.AST, first: str, name: str) -> bool:
    """Whether ``node`` sets the attribute ``name`` on ``first`` (``_stored_names``)."""
    stored = _stored_names(node, first)
    return name in stored or _ANY in stored


def _stored_names(node: ast.AST, first: str) -> set[str]:
    """The attributes ``node`` sets on ``first`` (``self``) or its class:
    ``self.k = v`` (``+=``, a ``for``/``with`` target), ``type(self).k = v``,
    ``self.__class__.k = v``, ``vars(self)["k"] = v``, ``self.__dict__["k"] = v``,
    ``self.__dict__.update(k=v)``, ``setattr(self, "k", v)``, ``object.__setattr__(self,
    "k", v)``, ``self.__setattr__("k", v)``; ``_ANY`` for a name not spelled out."""

    def is_self(expr: ast.expr, classes: bool = True) -> bool:
        if isinstance(expr, ast.Name):
            return expr.id == first
        if classes and isinstance(expr, ast.Attribute) and expr.attr == "__class__":
            return is_self(expr.value, False)
        return (
            classes
            and isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Name)
            and expr.func.id == "type"
            and len(expr.args) == 1
            and is_self(expr.args[0], False)
        )

    def named(expr: ast.expr | None, computed: bool = False) -> set[str]:
        if isinstance(expr, ast.Constant):
            return {expr.value} if isinstance(expr.value, str) else set()
        return {_ANY} if computed and expr is not None else set()

    def own_dict(expr: ast.expr) -> bool:
        if isinstance(expr, ast.Attribute) and expr.attr == "__dict__":
            return is_self(expr.value, False)
        return (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Name)
            and expr.func.id == "vars"
            and len(expr.args) == 1
            and is_self(expr.args[0], False)
        )

    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        return {node.attr} if is_self(node.value) else set()
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
        return named(node.slice) if own_dict(node.value) else set()
    if not isinstance(node, ast.Call):
        return set()
    func, args = node.func, node.args
    if isinstance(func, ast.Name) and func.id == "setattr":
        return named(args[1], computed=True) if len(args) == 3 and is_self(args[0]) else set()
    if isinstance(func, ast.Attribute) and func.attr == "__setattr__":
        if len(args) == 3:  # object.__setattr__(self, "k", v)
            return named(args[1], computed=True) if is_self(args[0]) else set()
        return named(args[0], computed=True) if is_self(func.value) and args else set()
    if isinstance(func, ast.Attribute) and func.attr == "update" and own_dict(func.value):
        keys = {k.arg for k in node.keywords if k.arg is not None}
        spread = bool(args) or any(k.arg is None for k in node.keywords)
        return keys | ({_ANY} if spread else set())
    return set()


#: A test a statement runs under: its text, and the names it loads.
_Test = tuple[str, list[str]]


def _tests(body: list[ast.stmt], text: str) -> dict[int, list[_Test]]:
    """By ``id`` of each statement of ``body``'s scope inside an ``if``, ``while`` or
    ``match``: the tests it runs under, outermost first (``if FLAG: K = 2.0`` binds K
    only while FLAG holds: an edit to FLAG changes what K is), each described once (the
    branches of an ``elif`` chain share all the tests before them)."""
    described: dict[int, _Test] = {}

    def describe(test: ast.expr) -> _Test:
        if id(test) not in described:
            described[id(test)] = (_segment(text, test), _loaded([test]))
        return described[id(test)]

    found: dict[int, list[_Test]] = {}
    for stmt, around in scope_statements(body):
        tests = [
            describe(s.subject if isinstance(s, ast.Match) else s.test)
            for s in around
            if isinstance(s, (ast.If, ast.While, ast.Match))
        ]
        if tests:
            found[id(stmt)] = tests
    return found


def _loads(stmt: ast.stmt) -> list[str]:
    """The names a binding statement reads (of a ``for`` or ``with``, its header's), in
    order of first appearance."""
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        parts: list[ast.AST] = [stmt.iter]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        parts = [item.context_expr for item in stmt.items]
    else:
        parts = [stmt]
    return _loaded(parts)


def _loaded(parts: Iterable[ast.AST]) -> list[str]:
    """The names loaded anywhere in ``parts``, in order of first appearance."""
    return list(
        dict.fromkeys(
            n.id
            for part in parts
            for n in ast.walk(part)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        )
    )


def _tested(
    stmt: ast.stmt, in_class: bool, conditions: dict[int, list[_Test]]
) -> tuple[list[str], list[tuple[str, _Where]]]:
    """The tests ``stmt`` runs under (``_tests``), as text, and the names they read, each
    as ``(name, looked up in the class scope first)``."""
    tests = conditions.get(id(stmt), [])
    loaded = dict.fromkeys(name for _text, names in tests for name in names)
    return [test for test, _names in tests], [(name, in_class) for name in loaded]


def _counted(
    stmt: ast.stmt, bound: str, in_class: bool, conditions: dict[int, list[_Test]]
) -> tuple[list[str], list[tuple[str, _Where]]]:
    """A binding ``stmt`` counted whole: its text ``bound`` and its tests, and the names
    they read in turn -- a definition's body as its module resolves them (its locals and
    parameters are not globals), its decorators, defaults and bases as the scope it sits
    in does (``in_class``: the class body first)."""
    added, reads = _tested(stmt, in_class, conditions)
    follows: list[tuple[str, _Where]]
    if isinstance(stmt, _DEFINITIONS):
        follows = [(read, in_class) for read in _loaded(_scope_parts(stmt)[1])]
        follows += [(read, False) for read in sorted(_free_names(stmt, frozenset()))]
        if in_class and not isinstance(stmt, ast.ClassDef):
            # A method reads its instance too: ``self.k = self._make_k()``.
            follows += [(read, _INSTANCE) for read in _instance_reads(stmt)]
    else:
        follows = [(read, in_class) for read in _loads(stmt)]
    return [bound, *added], follows + reads


def binding_digests(text: str, tree: Any, names: Iterable[str], scope: str = "") -> dict[str, str]:
    """For each of ``names``: a digest of the statements of ``text`` (parsed: ``tree``)
    that bind it at the top level of the module, or of the class ``scope`` (a dotted
    qualified name) -- their text in order, with the tests of the ``if``/``while``/``match``
    they sit under -- and of the statements binding what those read, in turn
    (``SCALE = BASE * 2`` changes with ``BASE``; a ``partial`` with the constant it binds;
    ``if FLAG: K = 2.0`` with ``FLAG``). In a class scope, the classes' headers count
    for every name (see below), and a name the body does not bind is not looked up
    among the module's globals (the bases have rows of their own). A name nothing binds
    has the digest of no statement, so a binding added (shadowing a builtin) or removed
    changes it too. A scope not found binds nothing. Digests are 16 hex digits: they tell a change, they do not
    authenticate (the pair's signature does)."""
    return {
        name: hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest()[:16]
        for name, (texts, _reached) in _bindings(text, tree, names, scope).items()
    }


def binding_reach(text: str, tree: Any, names: Iterable[str], scope: str = "") -> list[str]:
    """The module globals the bindings of ``names`` read in turn, besides ``names``
    (``X = BASE * 2``: BASE; ``K = compute()``: compute and what it reads), each once:
    where one is imported from a project module (``from .config import BASE``), the
    capture records it as that module binds it, as it does a name read directly."""
    found: dict[str, None] = {}
    for _texts, reached in _bindings(text, tree, names, scope).values():
        found.update(dict.fromkeys(n for n in reached if n not in names))
    return list(found)


def _bindings(
    text: str, tree: Any, names: Iterable[str], scope: str
) -> dict[str, tuple[list[str], list[str]]]:
    """Per name, what ``binding_digests`` digests (the binding texts, in order) and the
    module globals those bindings read, in turn (``binding_reach``)."""
    body: list[ast.stmt] = tree.body
    # A class's header -- its bases, decorators and keywords (a metaclass) -- decides
    # where an attribute its body does not bind comes from, and what the class is made
    # with: a decorator or metaclass defined in this module counts whole (the body of
    # ``with_gain`` in ``@with_gain(2.0)`` sets the attribute), and so does the
    # ``__init_subclass__`` of a base defined there. A base's body has rows of its own.
    headers: list[ast.AST] = []
    makers: set[str] = set()
    bases: set[str] = set()
    for part in filter(None, scope.split(".")):
        found = [s for s in _statements(body) if isinstance(s, ast.ClassDef) and s.name == part]
        if not found:
            body, headers, makers, bases = [], [], set(), set()
            break
        cls = found[-1]
        body = cls.body
        headers += [*cls.decorator_list, *cls.bases, *cls.keywords]
        makers |= {
            n.id
            for h in [*cls.decorator_list, *cls.keywords]
            for n in ast.walk(h)
            if isinstance(n, ast.Name)
        }
        bases |= {b.id for b in cls.bases if isinstance(b, ast.Name)}
    module_binders = _binders(tree.body)
    # A class at the module's top level, stored into by its name there.
    owner = scope if scope and "." not in scope and body else ""
    scope_binders = _binders(body) if scope else module_binders
    conditions = {**_tests(tree.body, text), **(_tests(body, text) if scope else {})}
    made_with: list[ast.stmt] = [
        stmt
        for stmt in _statements(tree.body)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and stmt.name in makers
    ]
    made_with += [  # a base's __init_subclass__ runs as the class is made
        method
        for stmt in _statements(tree.body)
        if isinstance(stmt, ast.ClassDef) and stmt.name in bases
        for method in stmt.body
        if isinstance(method, ast.FunctionDef) and method.name == "__init_subclass__"
    ]
    header = [_segment(text, h) for h in [*headers, *made_with]]
    # As the module binds them: ``SCALE`` in the decorator's body too.
    header_loads = [(name, False) for name in _loaded([*headers, *made_with])]
    result: dict[str, tuple[list[str], list[str]]] = {}
    # Per (statement, its text, scope flag): ``_counted``, once for all the names whose
    # bindings reach it (a module's functions calling each other).
    memo: dict[tuple[int, str, bool], tuple[list[str], list[tuple[str, _Where]]]] = {}

    def counted(
        stmt: ast.stmt, bound: str, in_class: bool
    ) -> tuple[list[str], list[tuple[str, _Where]]]:
        key = (id(stmt), bound, in_class)
        if key not in memo:
            memo[key] = _counted(stmt, bound, in_class, conditions)
        return memo[key]

    for name in sorted(set(names)):
        texts: list[str] = list(header)
        seen: set[tuple[str, bool]] = set()
        instance_seen: set[str] = set()
        # (name, where it is looked up: ``_Where``), in the order met.
        pending: collections.deque[tuple[str, _Where]] = collections.deque(
            [(name, True), *header_loads]
        )
        while pending:
            wanted, in_scope = pending.popleft()
            read_itself = (wanted, in_scope) == (name, True)
            if scope and (read_itself or in_scope == _INSTANCE):
                if wanted in instance_seen:
                    continue
                instance_seen.add(wanted)
                # An attribute read through the instance is what the class's methods set
                # on it (``self.k = k`` in ``__init__``, with its default), where they
                # do, whatever the body binds: they count whole; so does what sets it
                # on the class by name at the module's level (``Net.k = v``, a function
                # doing so).
                for method in _instance_stores(body, wanted, owner):
                    added, reads = counted(method, _header(method, text), True)
                    texts += added
                    pending += reads
                storers: set[str] = set()
                for stmt in module_binders.get(owner, []) if owner else []:
                    if isinstance(stmt, ast.ClassDef):
                        continue
                    call = stmt.value if isinstance(stmt, ast.Expr) else None
                    if any(_stores_attribute(n, owner, wanted) for n in ast.walk(stmt)):
                        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            storers.add(stmt.name)
                    elif not (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Name)
                        and call.func.id in storers
                    ):
                        continue  # neither a store of it nor a call of what stores it
                    added, reads = counted(stmt, _header(stmt, text), False)
                    texts += added
                    pending += reads
                if wanted not in scope_binders:
                    # A class attribute its body does not bind is its bases' (their own
                    # rows), never the module's global of that name.
                    seen.add((wanted, True))
                    continue
            table = scope_binders if in_scope and wanted in scope_binders else module_binders
            key = (wanted, table is scope_binders)
            if key in seen:
                continue
            seen.add(key)
            binders = table.get(wanted, [])
            if (
                not binders
                and table is module_binders
                and "__getattr__" in module_binders
                and not hasattr(builtins, wanted)  # a global lookup never asks __getattr__
            ):
                # ``other.LAZY`` where other binds no LAZY: its ``__getattr__`` (PEP 562)
                # answers, and counts whole.
                for stmt in module_binders["__getattr__"]:
                    added, reads = counted(stmt, _segment(text, stmt), False)
                    texts += added
                    pending += reads
            for stmt in binders:
                if isinstance(stmt, _DEFINITIONS) and read_itself and stmt.name == wanted:
                    # A function the capture ran through has its own record, and an edit
                    # to one it did not run changes nothing it computed: only that a
                    # definition binds the name counts (one added after an import), and
                    # the tests it sits under (``if FAST: def f`` ``else: def f``).
                    # Its decorators too: one that replaces f runs instead of it
                    # (``@cached``, ``@torch.compile``), and f then has no record.
                    texts.append(f"{type(stmt).__name__} {stmt.name}")
                    texts += ["@" + _segment(text, d) for d in stmt.decorator_list]
                    added, reads = _tested(stmt, table is scope_binders, conditions)
                    texts += added
                    in_class = table is scope_binders
                    pending += [(n, in_class) for n in _loaded(stmt.decorator_list)]
                    pending += reads
                    continue
                # Anything else a value was made with counts whole: ``K = compute()``
                # changes with compute's body.
                bound = _binding_text(stmt, wanted, text)
                if isinstance(stmt, (ast.Import, ast.ImportFrom)) and bound in texts:
                    continue  # ``import pkg.a`` and ``import pkg.b``: one binding of pkg
                added, reads = counted(stmt, bound, table is scope_binders)
                texts += added
                pending += reads
        reached = sorted({n for n, in_scope in seen if not in_scope or not scope})
        result[name] = (texts, reached)
    return result


def imported_names(tree: Any, package: str | None) -> dict[str, tuple[str, str]]:
    """Each name the module's top-level ``from X import a as name`` statements bind (the
    last one, where several do): X as an absolute module name (a relative X resolved in
    ``package``) and ``a``."""
    import importlib.util

    found: dict[str, tuple[str, str]] = {}
    for stmt in _statements(tree.body):
        if not isinstance(stmt, ast.ImportFrom):
            continue
        try:
            module = importlib.util.resolve_name("." * stmt.level + (stmt.module or ""), package)
        except (ImportError, ValueError):
            continue
        for alias in stmt.names:
            if alias.name != "*":
                found[alias.asname or alias.name] = (module, alias.name)
    return found


def star_sources(tree: Any, package: str | None) -> list[str]:
    """The modules the module's top-level ``from X import *`` statements import from, as
    absolute names, in order."""
    import importlib.util

    found = []
    for stmt in _statements(tree.body):
        if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
            try:
                found.append(
                    importlib.util.resolve_name("." * stmt.level + (stmt.module or ""), package)
                )
            except (ImportError, ValueError):
                continue
    return found


#: The nodes that open a scope of their own: names bound in them are theirs.
_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Lambda,
    ast.ClassDef,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def _scope_parts(scope: ast.AST) -> tuple[list[ast.AST], list[ast.AST]]:
    """What of ``scope`` runs in the scope itself, and what runs in the enclosing one (a
    function's decorators, defaults and annotations; a class's bases; a comprehension's
    first iterable)."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        args = scope.args
        outside: list[ast.AST] = [*args.defaults, *(d for d in args.kw_defaults if d)]
        if not isinstance(scope, ast.Lambda):
            outside += [*scope.decorator_list, *(a.annotation for a in _args(args) if a.annotation)]
            if scope.returns is not None:
                outside.append(scope.returns)
            return list(scope.body), outside
        return [scope.body], outside
    if isinstance(scope, ast.ClassDef):
        return list(scope.body), [*scope.decorator_list, *scope.bases, *scope.keywords]
    generators = scope.generators  # type: ignore[attr-defined]
    inside: list[ast.AST] = [generators[0].target, *generators[0].ifs]
    for generator in generators[1:]:
        inside += [generator.target, generator.iter, *generator.ifs]
    inside += [scope.key, scope.value] if isinstance(scope, ast.DictComp) else [scope.elt]  # type: ignore[attr-defined]
    return inside, [generators[0].iter]


def _args(args: ast.arguments) -> list[ast.arg]:
    extra = [a for a in (args.vararg, args.kwarg) if a is not None]
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *extra]


def _own_nodes(parts: list[ast.AST]) -> Iterator[ast.AST]:
    """Every node of ``parts`` that runs in their scope: nested scopes' own parts left
    out (their parts that run here, yielded as the nested scope itself)."""
    pending = list(parts)
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, _SCOPES):
            pending += _scope_parts(node)[1]
            continue
        pending += list(ast.iter_child_nodes(node))


def _free_names(scope: ast.AST, enclosing: frozenset[str]) -> set[str]:
    """The names loaded in ``scope`` (and the scopes inside it) that no function scope
    around the load binds: the globals and builtins it reads. A class body's names
    are not seen by the functions inside it, as Python resolves them."""
    inside, _outside = _scope_parts(scope)
    nodes = list(_own_nodes(inside))
    bound: set[str] = set()
    declared: set[str] = set()
    loaded: set[str] = set()
    nested: list[ast.AST] = []
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        bound |= {a.arg for a in _args(scope.args)}
    for node in nodes:
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, _SCOPES):
            nested.append(node)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= _bound(node)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared |= set(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    own = bound - declared
    free = {n for n in loaded if n not in own and n not in enclosing}
    # A class body's bindings are not a scope its methods see.
    passed = enclosing if isinstance(scope, ast.ClassDef) else enclosing | own
    for inner in nested:
        free |= _free_names(inner, frozenset(passed))
    return free


def _attribute_chain(node: ast.Attribute, first: str = "") -> tuple[str, list[str]] | None:
    """``a.b.c`` as ``("a", ["b", "c"])``; ``type(a).b`` and ``a.__class__.b`` as
    ``("a", ["b"])``; ``super().b`` as the attribute ``b`` of ``first`` (the function's
    first parameter); ``A(...).b`` as ``("A", ["b"])``; None for a chain that starts
    elsewhere (another call's result, a subscript)."""
    path: list[str] = []
    value: ast.expr = node
    while isinstance(value, ast.Attribute):
        path.append(value.attr)
        value = value.value
    path.reverse()
    if path[:1] == ["__class__"] and len(path) > 1:
        path = path[1:]  # ``self.__class__.k`` is ``type(self).k``
    if isinstance(value, ast.Name):
        return value.id, path
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "type"
        and len(value.args) == 1
        and isinstance(value.args[0], ast.Name)
    ):
        # ``type(self).k``: a class attribute of the parameter's class.
        return value.args[0].id, path
    if (
        first
        and isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
        and not value.args
    ):
        # ``super().k`` in a method: the attribute along its class's MRO.
        return first, path
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        # ``Cfg().k``: an attribute of an instance the class makes here (what its
        # methods set on it, or its body binds).
        return value.func.id, path
    return None


def _named_read(node: ast.AST, first: str) -> tuple[str, list[str]] | None:
    """A read spelled with the name as a string constant: ``getattr(x, "k")`` (with a
    default too), ``vars(x)["k"]`` and ``x.__dict__["k"]`` as ``x.k``;
    ``globals()["k"]`` and ``globals().get("k")`` as the global ``k`` (``("", ["k"])``).
    None for anything else (a computed name is not followed: ``--verify`` is)."""

    def constant(expr: ast.expr | None) -> str | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        return None

    def called(expr: ast.expr, name: str) -> list[ast.expr] | None:
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
            return list(expr.args) if expr.func.id == name else None
        return None

    def held(expr: ast.expr) -> tuple[str, list[str]] | None:
        if isinstance(expr, ast.Name):
            return expr.id, []
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
            return expr.func.id, []  # ``getattr(Cfg(), "k")``, as ``Cfg().k``
        if isinstance(expr, ast.Attribute):
            return _attribute_chain(expr, first)
        return None

    key: str | None = None
    owner: tuple[str, list[str]] | None = None
    if isinstance(node, ast.Call):
        args = called(node, "getattr")
        if args is not None and len(args) in (2, 3):
            key, owner = constant(args[1]), held(args[0])
        elif (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and called(node.func.value, "globals") == []
            and node.args
        ):
            key, owner = constant(node.args[0]), ("", [])
    elif isinstance(node, ast.Subscript):
        key = constant(node.slice)
        args = called(node.value, "vars")
        if args is not None and len(args) == 1:
            owner = held(args[0])
        elif called(node.value, "globals") == []:
            owner = ("", [])
        elif isinstance(node.value, ast.Attribute) and node.value.attr == "__dict__":
            owner = held(node.value.value)
    if key is None or owner is None:
        return None
    return owner[0], [*owner[1], key]


def local_imports(top: ast.AST) -> dict[str, tuple[str, str | None]]:
    """The names a function's own import statements bind (``from .helper import K``,
    ``from . import helper as h``, ``import pkg.helper``): name -> the module as written
    (relative ones with their dots) and the attribute imported from it (None for a
    plain ``import``). ``top``: the function's node (``function_reads``)."""
    found: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(top):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    module = "." * node.level + (node.module or "")
                    found[alias.asname or alias.name] = (module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = (alias.name, None)
                else:
                    head = alias.name.split(".")[0]
                    found[head] = (head, None)
    return found


def function_reads(
    top: ast.AST,
) -> tuple[list[str], str, dict[str, set[str]], dict[str, set[tuple[str, ...]]]]:
    """What a function (its definition or lambda in its module's tree:
    ``source_digest.function_node``) reads from outside it: the names it loads that no
    scope of its own binds (globals and builtins: a nested function's parameter shadows
    a global only inside that function), the name of its first parameter (``self``,
    ``cls``), per name loaded the attributes read from it (``name.attr``), and per name
    the longer attribute chains read from it (``pkg.helper.K`` as ``("helper", "K")``).
    The node, not its text parsed again: a line at column 0 inside it (a comment, a
    string's line) leaves the text undedentable, and a lambda's text alone need not
    parse."""
    first = _first_parameter(top)
    # Its defaults, decorators and annotations were evaluated in its module.
    names = _free_names(top, frozenset()) | set(_loaded(_scope_parts(top)[1]))
    attributes: dict[str, set[str]] = {}
    chains: dict[str, set[tuple[str, ...]]] = {}
    # A local made by calling a global (``cfg = Cfg()``): its attributes are read as the
    # ``Cfg().k`` they are.
    made: dict[str, set[str]] = {}
    for node in ast.walk(top):
        if (
            isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr))
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id in names
        ):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    made.setdefault(target.id, set()).add(node.value.func.id)
    for _node, root, path in _spelled_reads(top, first):
        if not root:  # ``globals()["k"]``
            names.add(path[0])
        elif not path:
            continue
        else:
            roots = made.get(root, set()) if root not in names and root != first else set()
            for owner in [root, *sorted(roots)]:
                attributes.setdefault(owner, set()).add(path[0])
                if len(path) > 1:
                    chains.setdefault(owner, set()).add(tuple(path))
    return sorted(names), first, attributes, chains


def changed_bindings(
    records: Iterable[dict[str, Any]], module_text: Callable[[str, str], str | None]
) -> Iterator[tuple[dict[str, Any], dict[str, Any], list[str]]]:
    """Yield ``(record, read, names)`` for each read (a row of a ``FUNCTION_SOURCES``
    record's ``reads``: module, path, class scope, each name's digest) some of whose
    ``names`` are bound differently now. ``module_text(module, path)`` reads a module's
    live text (None when it cannot, or it does not parse: every name read there has
    changed)."""
    texts: dict[tuple[str, str], str | None] = {}
    trees: dict[tuple[str, str], tuple[str, Any] | None] = {}
    for record in records:
        for read in record.get("reads", ()):
            key = (read["module"], read["path"])
            if key not in texts:
                texts[key] = module_text(*key)
            text = texts[key]
            if text is not None and source_digest(text) == read["module_sha256"]:
                continue  # the module reads as captured: so does every binding in it
            if key not in trees:
                tree = None if text is None else parse_module(text)
                trees[key] = None if text is None or tree is None else (text, tree)
            parsed = trees[key]
            recorded: dict[str, str] = read["names"]
            now = {} if parsed is None else binding_digests(*parsed, recorded, read["scope"])
            changed = [name for name, digest in recorded.items() if now.get(name) != digest]
            if changed:
                yield record, read, changed


__all__ = [
    "binding_digests",
    "binding_reach",
    "changed_bindings",
    "function_reads",
    "imported_names",
    "local_imports",
    "star_sources",
]
