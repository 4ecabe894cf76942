"""Dynamo-free guards at load: a variant's guard program (``_compat.guard_translation``) rebuilt as
Python accessors over the C++ leaf guards of ``torch._C._dynamo.guards``.

Emitted whole into Dynamo artifacts whose guards all translated; never imported by them.
Each leaf is the C++ class Dynamo's builder attaches, built with the arguments it
attached (a TYPE_MATCH's class found again by name), so it decides as Dynamo's does.
Each accessor is written to do what its C++ counterpart does:

- frame local / dict item: ``PyDict_GetItem`` -- a missing key fails, and a dict
  subclass's ``__getitem__`` / ``__missing__`` is not consulted (``dict.get``);
- attribute: ``PyObject_GetAttr`` -- any exception fails the guard;
- instance ``__dict__``: ``PyObject_GenericGetDict`` (``object.__getattribute__``);
- tuple item: ``PyTuple_GetItem`` on a tuple only;
- a dict's n-th key or value: after the dict's exact type and size are checked (what
  ``DictGuardManager`` does first), in ``PyDict_Next`` order (``dict.keys``), or
  ``.keys()`` order for a dict subclass whose manager calls it.

A node checks its leaves before its children, as the C++ managers do; a failing access
fails the guard. Where Dynamo skips a recheck (dict-tag "tag safe" subtrees), this
always checks: never less strict. Before each check the root snapshots the thread's
dispatch-key state, which every TENSOR_MATCH compares against (inference mode, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# >>> not emitted: artifacts carry compiled_source among their runtime functions
from precompile.artifact.bytecode import compiled_source

# <<< not emitted

if TYPE_CHECKING:
    # Bound by the artifact prelude (precompile._compat.prelude.PLAIN_GUARDS_PRELUDE).
    _guard_classes: Any = None
    _dispatch_key_set: Any = None
    _dispatch_keys: Any = None

    def _saved_tensors_hooks_inlineable() -> bool: ...


_MISSING = object()
_NO_LOCALS: dict[str, Any] = {}  # what the root (an empty tree) checks to snapshot state


def code_object(fields: dict[str, Any]) -> Any:
    """A code object from ``_compat.guard_translation.plain_code``'s fields (nested code likewise)."""
    consts = tuple(
        code_object(c["__code__"]) if isinstance(c, dict) and "__code__" in c else c
        for c in fields["co_consts"]
    )
    return (lambda: None).__code__.replace(**{**fields, "co_consts": consts})


def _named(module: str, qualname: str) -> Any:
    import importlib

    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _accessor(access: list[Any], scope: dict[str, Any]) -> Any:
    step = access[0]
    if step in ("local", "dict_item"):
        key = access[1]
        return lambda d: dict.get(d, key, _MISSING)
    if step == "globals":
        return lambda _f_locals: scope
    if step == "attr":
        name = access[1]
        return lambda obj: getattr(obj, name)
    if step == "generic_dict":
        return lambda obj: object.__getattribute__(obj, "__dict__")
    if step == "tuple_item":  # PyTuple_GetItem: a tuple (or subclass), no __getitem__
        index = access[1]
        return lambda t: tuple.__getitem__(t, index)
    if step == "list_item":  # PyList_GetItem: a list (or subclass), no __getitem__
        index = access[1]
        return lambda items: list.__getitem__(items, index)
    raise AssertionError(f"unknown guard accessor {step}")


def _tensor_reason(spec: dict[str, Any], value: Any) -> str:
    """Why a TENSOR_MATCH refused ``value``, worded as Dynamo's TensorCheck words it
    (for the refusal message only: the C++ leaf made the decision)."""
    import torch

    name = spec["name"]
    if not isinstance(value, torch.Tensor) or type(value) is not _named(*spec["pytype"]):
        return f"expected type of '{name}' to be a tensor type, ' but found {type(value)}"
    actual = str(value.dtype).removeprefix("torch.")
    if actual != spec["dtype"]:
        # c10's ScalarType names, which Dynamo's message prints
        names = {
            "float32": "Float",
            "float64": "Double",
            "float16": "Half",
            "bfloat16": "BFloat16",
            "int64": "Long",
            "int32": "Int",
            "int16": "Short",
            "int8": "Char",
            "uint8": "Byte",
            "bool": "Bool",
            "complex64": "ComplexFloat",
            "complex128": "ComplexDouble",
        }
        expected = names.get(spec["dtype"], spec["dtype"])
        return f"tensor '{name}' dtype mismatch. expected {expected}, actual " + names.get(
            actual, actual
        )
    if value.device.index is not None:
        return (
            f"tensor '{name}' Tensor device index mismatch. expected None, actual "
            f"{value.device.index}"
        )
    if value.requires_grad != spec["requires_grad"]:
        return (
            f"tensor '{name}' requires_grad mismatch. expected {spec['requires_grad']}, "
            f"actual {value.requires_grad}"
        )
    if value.dim() != len(spec["sizes"]):
        return f"tensor '{name}' rank mismatch. expected {len(spec['sizes'])}, actual {value.dim()}"
    for what, known, actual in (
        ("size", spec["sizes"], value.size()),
        ("stride", spec["strides"], value.stride()),
    ):
        for i, (expected, got) in enumerate(zip(known, actual)):
            if expected is not None and expected != got:
                return f"tensor '{name}' {what} mismatch at index {i}. expected {expected}, actual {got}"
    return (
        f"tensor '{name}' dispatch key set mismatch. expected "
        f"{_dispatch_key_set.from_raw_repr(spec['keys'])}, actual {_dispatch_keys(value)}"
    )


def _hooks_check(_value: Any) -> bool:
    """The saved-tensors-hooks guard with no hooks captured: none inlineable now."""
    return not _saved_tensors_hooks_inlineable()


def _expression(text: str) -> Any:
    """A shape guard over the frame locals ``L``, as plain Python (see
    ``_compat.guard_translation._plain_expression`` for what it may contain)."""
    code = compile(text, "<guard>", "eval")

    def check(f_locals: Any) -> bool:
        return bool(eval(code, {"__builtins__": {}}, {"L": f_locals}))

    return check


def _leaf(leaf: list[Any], root: Any) -> tuple[Any, list[str], Any]:
    """(a callable C++ leaf guard, its verbose code parts, what words its refusal or
    None)."""
    import torch

    kind = leaf[0]
    if kind == "type":
        cls = _named(*leaf[1])
        return _guard_classes.TYPE_MATCH(root, id(cls), leaf[2], None), leaf[2], None
    if kind == "tensor":
        spec, verbose = leaf[1], leaf[2]
        # TENSOR_MATCH reads dtype, device index and requires_grad off this tensor (a
        # meta tensor's index is a CPU tensor's: none) and takes the sizes, strides,
        # class and dispatch keys as given -- but an empty size list (a 0-dim tensor)
        # means "this tensor's own": so it has the guarded shape (None dims as 1).
        template = torch.empty_strided(
            [1 if n is None else n for n in spec["sizes"]],
            [1 if n is None else n for n in spec["strides"]],
            dtype=getattr(torch, spec["dtype"]),
            device="meta",
        )
        if spec["requires_grad"]:
            template.requires_grad_(True)
        keys = _dispatch_key_set.from_raw_repr(spec["keys"])
        guard = _guard_classes.TENSOR_MATCH(
            root,
            template,
            spec["sizes"],
            spec["strides"],
            spec["name"],
            verbose,
            None,
            _named(*spec["pytype"]),
            keys,
        )
        return guard, verbose, lambda value: _tensor_reason(spec, value)
    if kind == "lambda":
        form, verbose = leaf[1], leaf[2]
        check = _hooks_check if form[0] == "saved_tensors_hooks_none" else _expression(form[1])
        return _guard_classes.LAMBDA_GUARD(root, check, verbose, None), verbose, None
    name, args = leaf[1], leaf[2]
    verbose = next((a for a in args if isinstance(a, list) and a and isinstance(a[0], str)), [])
    return getattr(_guard_classes, name)(root, *args, None), verbose or [name], None


class _Node:
    """One guarded value: its leaves, then the values reached from it."""

    def __init__(self, spec: dict[str, Any], scope: dict[str, Any], root: Any) -> None:
        self.id = spec.get("id")
        access = spec.get("access") or [""]
        self.step = list(access)
        self.is_positional = access[0] in ("dict_key", "dict_value")
        self.position: int = access[1] if self.is_positional else -1
        self.is_key = access[0] == "dict_key"
        self.access: Any = (
            _accessor(access, scope) if spec.get("access") and not self.is_positional else None
        )
        self.source = spec.get("source", "")
        self.missing = (
            f"KeyError on {self.source}"
            if access[0] in ("local", "dict_item")
            else f"getattr failed on source {self.source}"
        )
        self.kind = spec["kind"]
        if self.kind == "dict":
            self.type = _named(*spec["type"])
            self.size = spec["size"]
            self.keys_call = spec["keys_call"]
        self.leaf_specs: list[list[Any]] = spec["leaves"]
        self.leaves = [_leaf(leaf, root) for leaf in spec["leaves"]]
        children = [_Node(c, scope, root) for c in spec["children"]]
        self.children = [c for c in children if not c.is_positional]
        self.positional = sorted((c for c in children if c.is_positional), key=lambda c: c.position)

    def first_failure(self, value: Any, reached: dict[int, Any]) -> str | None:
        """None when every guard under this node holds, else the first failing one.
        Records in ``reached`` the value of each node a relational guard compares."""
        if self.id in reached:
            reached[self.id] = value
        if self.kind == "dict":
            if type(value) is not self.type:
                return f"TYPE_MISMATCH({self.source})"
            if dict.__len__(value) != self.size:
                return f"len({self.source}) != {self.size}"
            if self.size == 0:
                return None
        for leaf, verbose, explain in self.leaves:
            if not leaf(value):
                return explain(value) if explain else verbose[0] if verbose else "a guard failed"
        for child in self.children:
            try:
                value_of = child.access(value)
            except Exception:
                value_of = _MISSING
            if value_of is _MISSING:
                return child.missing
            failed = child.first_failure(value_of, reached)
            if failed:
                return failed
        if self.positional:
            keys = list(value.keys()) if self.keys_call else list(dict.keys(value))
            for child in self.positional:
                if child.position >= len(keys):
                    return f"len({self.source}) != {self.size}"
                key = keys[child.position]
                item = key if child.is_key else dict.get(value, key, _MISSING)
                failed = child.first_failure(item, reached)
                if failed:
                    return failed
        return None


class _Verdict:
    """What ``check_verbose`` answers, as Dynamo's GuardDebugInfo does."""

    def __init__(self, failure: str | None) -> None:
        self.result = failure is None
        self.verbose_code_parts = [] if failure is None else [failure]


#: Leaves whose C++ check is one identity or exact-type test, written inline by the
#: compiled check (a call into a pybind leaf costs ~0.1 us; the test itself a few ns).
#: Each decides exactly as its C++ class: TYPE_MATCH compares ``Py_TYPE(value)`` with the
#: class; NONE/TRUE/FALSE_MATCH compare ``value`` with the singleton; EQUALS_MATCH of a
#: ``str`` or ``int`` checks the exact type first, then ``==`` (which for those types has
#: no user code and no identity shortcut that could differ). Anything else, or another
#: EQUALS_MATCH value, is called as the C++ leaf (DICT_CONTAINS and LAMBDA_GUARD: see
#: ``_inline_leaf``); ``check_verbose`` always walks the C++
#: leaves, so a refusal is worded by them.
_SINGLETON_LEAVES = {"NONE_MATCH": None, "TRUE_MATCH": True, "FALSE_MATCH": False}


def _unmarked(value: Any) -> bool:
    """Whether ``value`` has no ``_has_dynamo_dim_marking`` attribute (looked up as
    ``getattr`` does), in which case a DIMENSION_DYNAMIC_MARKING_GUARD holds whatever its
    arguments: torch 2.13's leaf reads that flag first and passes without it (checked:
    a plain tensor, each ``_dynamo_*_indices`` set without the flag, a class attribute
    without it, a non-tensor, with expected markings empty or not; the flag as a class
    attribute or through ``__getattr__`` is seen, a property raising AttributeError is
    not). An exception answers False: the leaf decides."""
    try:
        return not hasattr(value, "_has_dynamo_dim_marking")
    except Exception:
        return False


def _inline_leaf(spec: list[Any], var: str, const: Any) -> str | None:
    """The inline Python test equivalent to the C++ leaf ``spec`` describes, or None."""
    if spec[0] == "type":
        return f"type({var}) is {const(_named(*spec[1]))}"
    if spec[0] == "lambda":
        # LAMBDA_GUARD calls this Python check and takes its truth (an exception fails):
        # called directly, without the C++ leaf between.
        form = spec[1]
        check = _hooks_check if form[0] == "saved_tensors_hooks_none" else _expression(form[1])
        return f"{const(check)}({var})"
    if spec[0] != "leaf":
        return None
    name, args = spec[1], spec[2]
    if name in _SINGLETON_LEAVES:
        return f"{var} is {_SINGLETON_LEAVES[name]!r}"
    if name == "DICT_CONTAINS" and type(args[0]) is bool:
        # PyDict_Check and PyDict_Contains (a dict subclass's __contains__ is not asked;
        # a value that is no dict contains nothing), compared with the captured answer.
        found = f"(isinstance({var}, dict) and _dict_contains({var}, {const(args[1])}))"
        return f"{found} is {args[0]!r}"
    if name == "EQUALS_MATCH" and type(args[0]) in (str, int):
        return f"(type({var}) is {type(args[0]).__name__} and {var} == {const(args[0])})"
    return None


def _fast_source(
    node: _Node,
    var: str,
    emit: Any,
    const: Any,
    fresh: Any,
    watched: set[int],
    tensors: list[tuple[str, Any, dict[str, Any]]],
) -> None:
    """Straight-line code that checks what ``node.first_failure`` checks, in its order,
    returning None at the first failure (any exception fails, as in the C++ accessors).
    ``node.first_failure`` stays the reference, and words a refusal. The TENSOR_MATCH
    leaves are not called here: each guarded value's variable, leaf and spec go to
    ``tensors``, checked together after the tree (``PlainGuards._tensors_hold``)."""
    if node.id in watched:
        emit(f"reached[{node.id!r}] = {var}")
    if node.kind == "dict":
        emit(f"if type({var}) is not {const(node.type)}: return None")
        emit(f"if _dict_len({var}) != {node.size!r}: return None")
        if node.size == 0:
            return
    for (leaf, _verbose, _explain), spec in zip(node.leaves, node.leaf_specs):
        if spec[0] == "tensor":
            tensors.append((var, leaf, spec[1]))
            continue
        test = _inline_leaf(spec, var, const)
        if spec[0] == "leaf" and spec[1] == "DIMENSION_DYNAMIC_MARKING_GUARD":
            # A value without the marking flag passes (``_unmarked``); one with it, the
            # leaf decides.
            test = f"({const(_unmarked)}({var}) or {const(leaf)}({var}))"
        emit(f"if not {test or f'{const(leaf)}({var})'}: return None")
    for child in node.children:
        value = fresh()
        step, *arg = child.step
        if step in ("local", "dict_item"):
            emit(f"{value} = _dict_get({var}, {const(arg[0])}, _MISSING)")
            emit(f"if {value} is _MISSING: return None")
        elif step == "globals":
            emit(f"{value} = _scope")
        elif step == "attr":
            emit(f"{value} = getattr({var}, {const(arg[0])})")
        elif step == "generic_dict":
            emit(f'{value} = _object_getattribute({var}, "__dict__")')
        elif step == "tuple_item":
            emit(f"{value} = _tuple_getitem({var}, {arg[0]!r})")
        else:
            emit(f"{value} = {const(child.access)}({var})")
            emit(f"if {value} is _MISSING: return None")
        _fast_source(child, value, emit, const, fresh, watched, tensors)
    if node.positional:
        keys = fresh()
        emit(f"{keys} = list({var}.keys()) if {node.keys_call!r} else list(_dict_keys({var}))")
        for child in node.positional:
            emit(f"if len({keys}) <= {child.position!r}: return None")
            value = fresh()
            if child.is_key:
                emit(f"{value} = {keys}[{child.position!r}]")
            else:
                emit(f"{value} = _dict_get({var}, {keys}[{child.position!r}], _MISSING)")
            _fast_source(child, value, emit, const, fresh, watched, tensors)


def _fast_check(
    tree: _Node, watched: set[int], scope: dict[str, Any]
) -> tuple[Any, list[tuple[Any, dict[str, Any]]]]:
    """``tree``'s checks but its TENSOR_MATCH leaves compiled into one function
    ``(f_locals, reached) -> tuple | None``: None when a check fails, else the values
    the TENSOR_MATCH leaves guard, in tree order; with those leaves (and specs)."""
    lines: list[str] = []
    consts: dict[str, Any] = {
        "_MISSING": _MISSING,
        "_dict_len": dict.__len__,
        "_dict_keys": dict.keys,
        "_dict_get": dict.get,
        "_scope": scope,
        "_object_getattribute": object.__getattribute__,
        "_tuple_getitem": tuple.__getitem__,
        "getattr": getattr,
        "type": type,
        "isinstance": isinstance,
        "dict": dict,
        "_dict_contains": dict.__contains__,
        "str": str,
        "int": int,
    }
    counter = [0]

    def emit(line: str) -> None:
        lines.append("        " + line)

    def const(value: Any) -> str:
        name = f"_c{len(consts)}"
        consts[name] = value
        return name

    def fresh() -> str:
        counter[0] += 1
        return f"_v{counter[0]}"

    tensors: list[tuple[str, Any, dict[str, Any]]] = []
    _fast_source(tree, "f_locals", emit, const, fresh, watched, tensors)
    found = "".join(f"{var}, " for var, _leaf, _spec in tensors)
    source = "\n".join(
        [
            "def fast(f_locals, reached):",
            "    try:",
            *lines,
            "    except Exception:",
            "        return None",
            f"    return ({found})",
        ]
    )
    namespace = dict(consts)
    exec(compiled_source(source, "<precompile guards>"), namespace)
    return namespace["fast"], [(leaf, spec) for _var, leaf, spec in tensors]


def _epilogue_check(texts: list[str], scope: dict[str, Any]) -> Any:
    """``holds(f_locals) -> bool``: the epilogue guards ``texts`` (expressions over ``L``,
    the frame locals, and ``G``, the module's globals) compiled into one function that
    decides as ``_tail_failure``'s ``eval`` of each does: no builtins, ``L`` and ``G``
    the only names, any exception a failure."""
    # Each text on lines of its own: a trailing comment ends with its line.
    lines = [f"        if not (\n{text}\n        ): return False" for text in texts] or [
        "        pass"
    ]
    head = ["def holds(L):", "    try:"]
    tail = ["    except Exception:", "        return False", "    return True"]
    source = "\n".join([*head, *lines, *tail])
    namespace: dict[str, Any] = {"__builtins__": {}, "G": scope}
    exec(compiled_source(source, "<precompile guards>"), namespace)
    return namespace["holds"]


class PlainGuards:
    """One variant's guards: ``check(f_locals)`` and ``check_verbose(f_locals)``, as on
    Dynamo's guard manager."""

    #: A refusal is final: there is no cached fast path to retry past.
    checks_once = True

    def __init__(self, program: dict[str, Any], scope: dict[str, Any]) -> None:
        import threading

        # Owns the leaves; its own tree stays empty, so its check() only snapshots the
        # thread's dispatch-key state for the TENSOR_MATCH leaves.
        self._root = _guard_classes.RootGuardManager()
        self._tree = _Node(program["root"], scope, self._root)
        self._scope = scope
        self._epilogue = [
            (compiled_source(text, "<guard>", "eval"), verbose)
            for text, verbose in program["epilogue"]
        ]
        self._relations = program.get("relations", [])
        self._watched = {i for relation in self._relations for i in relation["nodes"]}
        self._fast, tensor_leaves = _fast_check(self._tree, self._watched, scope)
        self._tensor_leaves = [leaf for leaf, _spec in tensor_leaves]
        self._tensor_specs = [spec for _leaf, spec in tensor_leaves]
        # The TENSOR_MATCH leaves as one C call (TensorGuards.check), learned on the
        # first values they all pass; None until then, or for good when those values
        # repeat a tensor (TensorGuards refuses a repeated tensor; the leaves do not).
        self._combined: Any = None
        self._learnable = bool(self._tensor_leaves)
        self._epilogue_holds = _epilogue_check([text for text, _v in program["epilogue"]], scope)
        # Reentrant: an accessor may run user code (a property) that calls the artifact
        # again on this thread; the root's snapshot is this thread's either way.
        self._lock = threading.RLock()

    def _first_failure(self, f_locals: dict[str, Any]) -> str | None:
        with self._lock:
            self._root.check(f_locals)
            reached: dict[int, Any] = dict.fromkeys(self._watched, _MISSING)
            failed = self._tree.first_failure(f_locals, reached)
            return failed or self._tail_failure(f_locals, reached)

    def _tail_failure(self, f_locals: dict[str, Any], reached: dict[int, Any]) -> str | None:
        """What runs after the tree holds: the relational guards over the values it
        reached, then the epilogue (as Dynamo's root runs its epilogue guards last)."""
        for relation in self._relations:
            values = [reached[i] for i in relation["nodes"]]
            ids = {id(v) for v in values}
            held = len(ids) == len(values) if relation["kind"] == "distinct" else len(ids) == 1
            if any(v is _MISSING for v in values) or not held:
                if relation["kind"] == "distinct":
                    return "Duplicate tensor found where not expected!"
                return str(relation["verbose"][0]) if relation["verbose"] else "aliasing"
        for code, verbose in self._epilogue:
            try:
                held = bool(eval(code, {"__builtins__": {}}, {"L": f_locals, "G": self._scope}))
            except Exception:
                held = False
            if not held:
                return str(verbose[0]) if verbose else "a guard failed"
        return None

    def _tensors_hold(self, found: tuple[Any, ...]) -> bool:
        """Whether every TENSOR_MATCH leaf holds for its value in ``found``.

        One ``TensorGuards.check`` over all of them decides a pass when it can: it is
        built from values that just passed every leaf, with the leaves' size and stride
        specs (None: a dynamic dim), so each of its ``TensorCheck``s compares the same
        fields (class, dispatch keys under the thread's state, dtype, device index,
        requires_grad, rank, sizes, strides) against the same expected values as the
        leaf's -- a pass of it is a pass of every leaf. When it fails (or is not built)
        the leaves decide, so it never refuses what they accept (it also refuses a
        repeated tensor, which the leaves do not)."""
        combined = self._combined
        if combined is not None and combined(*found):
            return True
        if not found:
            return True  # no TENSOR_MATCH leaf: no dispatch-key state to snapshot
        # Every TENSOR_MATCH compares against the root's snapshot of the thread's
        # dispatch-key state, taken here, right before them.
        self._root.check(_NO_LOCALS)
        for leaf, value in zip(self._tensor_leaves, found):
            if not leaf(value):
                return False
        if self._learnable:
            self._learn(found)
        return True

    def _learn(self, found: tuple[Any, ...]) -> None:
        """Builds the combined check from ``found`` (values that passed every leaf) and
        keeps it when, in one stretch of C calls with no Python in between (so one
        thread state), the leaves pass again and it passes too."""
        self._learnable = False
        if len({id(value) for value in found}) != len(found):
            return  # TensorGuards refuses a repeated tensor: the leaves stay the check
        combined = _guard_classes.TensorGuards(
            *found,
            dynamic_dims_sizes=[list(spec["sizes"]) for spec in self._tensor_specs],
            dynamic_dims_strides=[list(spec["strides"]) for spec in self._tensor_specs],
        )
        self._root.check(_NO_LOCALS)
        if all(leaf(v) for leaf, v in zip(self._tensor_leaves, found)) and combined.check(*found):
            self._combined = combined.check

    def check(self, f_locals: dict[str, Any]) -> bool:
        """The compiled tree, its TENSOR_MATCH leaves together (``_tensors_hold``), then
        what follows it in ``_first_failure``; a refusal is explained by
        ``check_verbose``, which walks the tree itself. Without relational guards (most
        variants) the epilogue is one compiled function, not an ``eval`` per guard."""
        with self._lock:
            if not self._relations:
                found = self._fast(f_locals, None)
                return (
                    found is not None
                    and self._tensors_hold(found)
                    and self._epilogue_holds(f_locals)
                )
            reached: dict[int, Any] = dict.fromkeys(self._watched, _MISSING)
            found = self._fast(f_locals, reached)
            return (
                found is not None
                and self._tensors_hold(found)
                and self._tail_failure(f_locals, reached) is None
            )

    def check_verbose(self, f_locals: dict[str, Any]) -> _Verdict:
        return _Verdict(self._first_failure(f_locals))
