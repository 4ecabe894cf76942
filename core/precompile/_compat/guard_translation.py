"""Dynamo-free guards for standalone Dynamo artifacts: the capture-side translation.

A standalone artifact loaded through Dynamo (``load_guard_manager``) imports
``torch._dynamo``, which costs about as much again as ``import torch``. Its guard tree
cannot be rebuilt from ``torch._C._dynamo.guards`` alone either: creating any child
manager (``framelocals_manager``, ``getattr_manager``, ...) makes the C++ side import
``torch._dynamo.guards`` for its ``GuardManagerType`` enum. The leaf guards (TYPE_MATCH,
TENSOR_MATCH, ...) do not: they are plain C++ objects, callable on a value.

So at capture, with Dynamo present, each variant's guard tree is rebuilt exactly as the
artifact would rebuild it today, while every call Dynamo's builder makes on the C++
managers is recorded (``guard_recorder``). The record becomes a *program*: the path
from the frame's locals to each guarded value (an accessor per step: frame local, module
global, dict item, attribute, instance ``__dict__``, tuple item, a dict's n-th key or
value), and at each value the leaf guards Dynamo attached, with the arguments it
attached them with. At load
(``runtime.multigraph_guards.PlainGuards``) the accessors run as Python written to match the C++
accessors, and the leaves are the same C++ leaf classes built with the same arguments,
so each leaf decides exactly as Dynamo's does.

Only a whitelist translates (``_ACCESSORS``, ``_LEAVES``, the lambda and epilogue forms
in ``_lambda_form``); anything else raises ``UnsupportedGuards`` with what it was, and the
artifact keeps loading through Dynamo.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import types
from typing import Any

import torch

from precompile._compat.guard_recorder import GuardRecorder

#: The one Dynamo module transformed bytecode may name on the Dynamo-free path, what it
#: may read from it, and what the payload names instead (``_DynamoUtilsStandIn``).
DYNAMO_UTILS = "torch._dynamo.utils"
_DYNAMO_UTILS_READS = {
    "record_pregraph_bytecode_enter",
    "record_pregraph_bytecode_exit",
    "call_size",
    "call_stride",
    "call_storage_offset",
}
DYNAMO_UTILS_STAND_IN = "precompile:dynamo-utils-stand-in"


class UnsupportedGuards(Exception):
    """A guard outside the whitelist: the artifact keeps Dynamo's guard manager."""


#: Accessor methods of the C++ managers the program reproduces, and the step each is.
_ACCESSORS = {
    "framelocals_manager": "local",
    "globals_dict_manager": "globals",
    "dict_getitem_manager": "dict_item",
    "getattr_manager": "attr",
    "get_generic_dict_manager": "generic_dict",
    "tuple_getitem_manager": "tuple_item",
    "list_getitem_manager": "list_item",
    "get_key_manager": "dict_key",
    "get_value_manager": "dict_value",
}

#: Leaf-guard methods -> the C++ leaf class the program rebuilds (same arguments, after
#: the owning root). Each one's check is the C++ class's own.
_LEAVES = {
    "add_type_match_guard": "TYPE_MATCH",
    "add_dict_contains_guard": "DICT_CONTAINS",
    "add_tensor_match_guard": "TENSOR_MATCH",
    "add_dimension_marking_guard": "DIMENSION_DYNAMIC_MARKING_GUARD",
    "add_default_device_guard": "DEFAULT_DEVICE",
    "add_torch_function_mode_stack_guard": "TORCH_FUNCTION_MODE_STACK",
    "add_equals_match_guard": "EQUALS_MATCH",
    "add_none_match_guard": "NONE_MATCH",
    "add_false_match_guard": "FALSE_MATCH",
    "add_true_match_guard": "TRUE_MATCH",
    "add_length_check_guard": "LENGTH_CHECK",
    "add_dict_length_check_guard": "DICT_LENGTH",
    "add_no_hasattr_guard": "NO_HASATTR",
    "add_lambda_guard": "LAMBDA_GUARD",
}

#: Values a leaf's arguments may hold: they are pickled into the artifact and compared
#: by the C++ leaf exactly as at capture.
_PLAIN_VALUES = (str, int, float, bool, type(None))

_SAVED_TENSORS_HOOKS = "torch._functorch.aot_autograd.utils.top_saved_tensors_hooks ids == None"


def _importable(obj: Any) -> list[str]:
    """``[module, qualname]`` that names ``obj`` in any process that imports the module."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname:
        raise UnsupportedGuards(f"{obj!r} has no importable name")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise UnsupportedGuards(f"{module}.{qualname} is not importable ({error})") from error
    if found is not obj:
        raise UnsupportedGuards(f"{module}.{qualname} is not {obj!r}")
    return [module, qualname]


#: Expression nodes a shape or aliasing guard may use to be evaluated as plain Python.
_EXPRESSION_NODES = (
    ast.Expression,
    ast.Compare,
    ast.BinOp,
    ast.BoolOp,
    ast.UnaryOp,
    ast.Subscript,
    ast.Call,
    ast.Attribute,
    ast.Name,
    ast.Constant,
    ast.Load,
    ast.cmpop,
    ast.operator,
    ast.boolop,
    ast.unaryop,
)


def _plain_expression(text: str) -> str:
    """``text`` if it is a guard expression plain Python evaluates as Dynamo's lambda
    does: names ``L`` (frame locals) and ``G`` (module globals) only, integer or string
    constants, arithmetic and comparisons, and calls only ``.size()``, ``.stride()``,
    ``.storage_offset()`` without arguments."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise UnsupportedGuards(f"guard expression {text!r} ({error})") from error
    for node in ast.walk(tree):
        if not isinstance(node, _EXPRESSION_NODES):
            raise UnsupportedGuards(f"{type(node).__name__} in guard expression {text!r}")
        if isinstance(node, ast.Name) and node.id not in ("L", "G"):
            raise UnsupportedGuards(f"name {node.id!r} in guard expression {text!r}")
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in ("size", "stride", "storage_offset")
            and not node.args
            and not node.keywords
        ):
            raise UnsupportedGuards(f"a call in guard expression {text!r}")
        if isinstance(node, ast.Constant) and type(node.value) not in (int, str):
            raise UnsupportedGuards(f"constant {node.value!r} in guard expression {text!r}")
    return text


def _guard_text(verbose: Any) -> str:
    """A guard's code, without the ``  # source line`` Dynamo appends."""
    first = verbose[0] if isinstance(verbose, list) and verbose else ""
    return str(first).split("  #")[0].strip()


def _lambda_form(verbose: Any, shape_expressions: list[str]) -> list[str]:
    """What a Python lambda guard is, when it is one of the forms with a known plain
    equivalent: the saved-tensors-hooks check, or a shape guard Dynamo compiled from the
    shape environment's python code parts."""
    if not (isinstance(verbose, list) and len(verbose) == 1):
        raise UnsupportedGuards(f"a lambda guard of {len(verbose)} parts")
    text = _guard_text(verbose)
    if text == _SAVED_TENSORS_HOOKS:
        return ["saved_tensors_hooks_none"]
    if text in shape_expressions:
        return ["expression", _plain_expression(text)]
    raise UnsupportedGuards(f"lambda guard {text!r}")


def _epilogue_expression(verbose: Any, shape_expressions: list[str]) -> str:
    """An epilogue guard as one plain expression. Dynamo builds its function from code
    parts it also shows (``verbose``, each with a ``  # source`` comment appended) and
    requires all of them: here either every part is an aliasing check ``a is b``, or
    the parts are exactly the shape environment's python code parts."""
    if not isinstance(verbose, list) or not verbose:
        raise UnsupportedGuards("an epilogue guard without code")
    texts = [str(part).split("  #")[0].strip() for part in verbose]
    aliasing = all(t.count(" is ") == 1 and " is not " not in t for t in texts)
    if aliasing:
        return " and ".join(f"({_plain_expression(t)})" for t in texts)
    if texts != shape_expressions and _conjuncts(texts) != _conjuncts(shape_expressions):
        raise UnsupportedGuards(f"epilogue guard {texts!r:.300}")
    # The shape environment's own parts: what Dynamo compiled the guard from (its shown
    # text may chain the comparisons, ``2 <= s <= 15`` for ``2 <= s and s <= 15``).
    return " and ".join(f"({_plain_expression(t)})" for t in shape_expressions)


def _conjuncts(texts: list[str]) -> list[str] | None:
    """The conjunction of ``texts`` as its list of single comparisons (``a <= b <= c``
    is ``a <= b and b <= c``, as Python evaluates it for side-effect-free operands), to
    tell that two spellings of a shape guard are one; None if one does not parse."""
    found: list[str] = []

    def walk(node: ast.expr) -> None:
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            for value in node.values:
                walk(value)
        elif isinstance(node, ast.Compare) and len(node.ops) > 1:
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands, operands[1:]):
                walk(ast.Compare(left=left, ops=[op], comparators=[right]))
        else:
            found.append(ast.dump(node))

    for text in texts:
        try:
            walk(ast.parse(text, mode="eval").body)
        except SyntaxError:
            return None
    return found


def _plain_value(value: Any) -> bool:
    if type(value) in _PLAIN_VALUES:
        return not (isinstance(value, float) and value != value)
    if type(value) in (list, tuple):
        return all(map(_plain_value, value))
    if type(value) is dict:
        return all(_plain_value(k) and _plain_value(v) for k, v in value.items())
    return False


def _classes_near(log: list[Any]) -> dict[int, type]:
    """Classes a TYPE_MATCH may name, by id: the types of the example values the builder
    passed, and the builtin classes."""
    found: dict[int, type] = {}
    for *_head, kwargs, _child, _made in log:
        example = kwargs.get("example_value") if isinstance(kwargs, dict) else None
        for cls in (type(example), example if isinstance(example, type) else None):
            if cls is not None:
                found[id(cls)] = cls
    for value in vars(builtins).values():
        if isinstance(value, type):
            found[id(value)] = value
    return found


def _translate(
    log: list[Any], root: int, scope: dict[str, Any], shape_expressions: list[str]
) -> dict[str, Any]:
    nodes: dict[int, dict[str, Any]] = {
        root: {"id": root, "kind": "plain", "leaves": [], "children": []}
    }
    epilogue: list[list[Any]] = []
    relations: list[dict[str, Any]] = []
    generic_dicts: list[dict[str, Any]] = []  # the values whose __dict__ a guard reads
    classes = _classes_near(log)
    for owner, name, args, kwargs, child, made in log:
        if owner is None:
            relations.append(_relation(name, args, nodes))
            continue
        if owner not in nodes:
            raise UnsupportedGuards(f"{name} on a manager the builder did not make")
        parent = nodes[owner]
        if name in _ACCESSORS:
            if child in nodes:
                continue  # the builder asked again for a manager it already made
            step = _ACCESSORS[name]
            example = kwargs.get("example_value")
            if step == "local":
                key = kwargs["key"]
                access = [step, key[0] if isinstance(key, tuple) else key]
            elif step == "globals":
                if kwargs["f_globals"] is not scope:
                    raise UnsupportedGuards("a guard reads another module's globals")
                access = [step]
            elif step == "dict_item":
                if not _plain_value(kwargs["key"]):
                    raise UnsupportedGuards(f"dict key {kwargs['key']!r}")
                access = [step, kwargs["key"]]
            elif step == "attr":
                access = [step, kwargs["attr"]]
            elif step in ("tuple_item", "list_item"):
                if type(kwargs["key"]) is not int or kwargs["key"] < 0:
                    raise UnsupportedGuards(f"{name} at {kwargs['key']!r}")
                access = [step, kwargs["key"]]
            elif step in ("dict_key", "dict_value"):
                if parent["kind"] != "dict":
                    raise UnsupportedGuards(f"{name} on a manager that is not a dict's")
                index = kwargs["index"] if "index" in kwargs else args[0] if args else None
                if type(index) is not int or index < 0:
                    raise UnsupportedGuards(f"{name} at position {index!r}")
                access = [step, index]
            else:
                access = [step]
                generic_dicts.append(parent)
            node: dict[str, Any] = {
                "id": child,
                "access": access,
                "source": kwargs.get("source", ""),
                "kind": "plain",
                "leaves": [],
                "children": [],
            }
            if made in ("DictGuardManager", "DictSubclassGuardManager"):
                node |= {
                    "kind": "dict",
                    "keys_call": made == "DictSubclassGuardManager",
                    "size": dict.__len__(example),
                    "type": _importable(type(example)),
                }
            elif made != "GuardManager":
                raise UnsupportedGuards(f"guard manager {made}")
            assert child is not None  # an accessor always makes a manager
            nodes[child] = node
            parent["children"].append(node)
        elif name in _LEAVES:
            if parent["kind"] == "dict":
                # DictGuardManager drops TYPE_MATCH and DICT_LENGTH (it checks both
                # itself) and refuses any other leaf.
                if name in ("add_type_match_guard", "add_dict_length_check_guard"):
                    continue
                raise UnsupportedGuards(f"{name} on a dict manager")
            parent["leaves"].append(_leaf(name, list(args), classes, shape_expressions))
        elif name == "add_epilogue_lambda_guard":
            epilogue.append([_epilogue_expression(args[1], shape_expressions), list(args[1])])
        elif name.startswith("mark_"):
            continue  # tag safety lets Dynamo skip rechecks; the program always checks
        else:
            raise UnsupportedGuards(name)
    for parent in generic_dicts:
        _check_generic_dict(parent)
    return {"root": nodes[root], "epilogue": epilogue, "relations": relations}


def _relation(name: str, args: tuple[Any, ...], nodes: dict[int, Any]) -> dict[str, Any]:
    """A relational guard over values the tree reaches: NO_TENSOR_ALIASING (no two are
    one object) or OBJECT_ALIASING (the two are one object), as the C++ guards compare
    them, by identity."""
    if name == "install_no_tensor_aliasing_guard":
        managers, verbose = args[0], args[2]
        kind = "distinct"
    elif name == "install_object_aliasing_guard":
        managers, verbose = [args[0], args[1]], args[2]
        kind = "same"
    else:
        raise UnsupportedGuards(f"relational guard {name}")
    ids = []
    for marker in managers:
        if not (isinstance(marker, tuple) and marker[0] == "node" and marker[1] in nodes):
            raise UnsupportedGuards(f"{name} over a value outside the guard tree")
        ids.append(marker[1])
    return {"kind": kind, "nodes": ids, "verbose": list(verbose)}


def _check_generic_dict(parent: dict[str, Any]) -> None:
    """``x.__dict__`` through PyObject_GenericGetDict is what
    ``object.__getattribute__(x, "__dict__")`` returns when ``x``'s class (fixed by a
    TYPE_MATCH on ``x``, checked first) keeps the ``__dict__`` descriptor type() made."""
    matched = [leaf for leaf in parent["leaves"] if leaf[0] == "type"]
    if not matched:
        raise UnsupportedGuards("an instance __dict__ read off a value of unchecked type")
    module, qualname = matched[0][1]
    cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    owner = next((c for c in cls.__mro__ if "__dict__" in vars(c)), None)
    descriptor = vars(owner).get("__dict__") if owner is not None else None
    if not (
        type(descriptor).__name__ == "getset_descriptor"
        and getattr(descriptor, "__objclass__", None) is owner
        and owner is not object
    ):
        raise UnsupportedGuards(f"{qualname} defines its own __dict__")


def _leaf(
    name: str, args: list[Any], classes: dict[int, type], shape_expressions: list[str]
) -> list[Any]:
    leaf = _LEAVES[name]
    if name == "add_type_match_guard":
        cls = classes.get(args[0])
        if cls is None:
            raise UnsupportedGuards("TYPE_MATCH of a class the capture cannot name")
        return ["type", _importable(cls), list(args[1])]
    if name == "add_tensor_match_guard":
        value, sizes, strides, tensor_name, verbose, _stack, pytype, keys = args
        if value.device.type != "cpu" or value.layout != torch.strided:
            raise UnsupportedGuards(f"TENSOR_MATCH on a {value.device.type} {value.layout} tensor")
        spec = {
            "dtype": str(value.dtype).removeprefix("torch."),
            "requires_grad": bool(value.requires_grad),
            "sizes": list(sizes),
            "strides": list(strides),
            "name": tensor_name,
            "pytype": _importable(pytype),
            "keys": int(keys.raw_repr()),
        }
        return ["tensor", spec, list(verbose)]
    if name == "add_lambda_guard":
        return ["lambda", _lambda_form(args[1], shape_expressions), list(args[1])]
    if name == "add_torch_function_mode_stack_guard":
        if args[0]:
            raise UnsupportedGuards("a torch function mode was active at capture")
        return ["leaf", leaf, [[], list(args[1])]]
    kept = args[:-1]  # the last argument is the user stack, which no check reads
    if not all(map(_plain_value, kept)):
        raise UnsupportedGuards(f"{leaf} on a {', '.join(type(a).__name__ for a in kept)}")
    return ["leaf", leaf, kept]


def plain_guard_program(
    guards_state: bytes,
    code: types.CodeType,
    scope: dict[str, Any],
    dict_keys: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The Dynamo-free program of one variant's guards, as Dynamo's builder makes them for
    ``code`` in ``scope`` (where the artifact's globals are bound as they will be at
    load), or ``UnsupportedGuards``. The program round-trips through pickle unchanged.
    The keys ``dict_keys`` records as named by position are named by key first
    (``_compat.runtime.dict_keys_by_name``), as a load through Dynamo names them."""
    from torch._dynamo.package import load_guard_manager, load_guards_state

    from precompile._compat.runtime import dict_keys_by_name

    state = dict_keys_by_name(load_guards_state(guards_state), dict_keys or [])
    parts = state.shape_code_parts
    shape_expressions = [
        str(e).strip() for e in getattr(getattr(parts, "python_code_parts", None), "exprs", [])
    ]
    recorder = GuardRecorder()
    with recorder.active():
        wrapper = load_guard_manager(state, code, scope)
    root = recorder.node(wrapper.root)
    program = _translate(recorder.log, root, scope, shape_expressions)
    _check_complete(wrapper.root, program, recorder)
    return program


def _leaf_class(leaf: list[Any]) -> str:
    return {"type": "TYPE_MATCH", "tensor": "TENSOR_MATCH", "lambda": "LAMBDA_GUARD"}.get(
        leaf[0], leaf[1] if leaf[0] == "leaf" else "?"
    )


def _check_complete(root: Any, program: dict[str, Any], recorder: GuardRecorder) -> None:
    """Make the program exactly the tree Dynamo built, or refuse it: every manager must be
    a program node with the same leaf guards by kind (a relational guard is a leaf of
    each manager it spans) and as many children, and the root as many epilogue guards. A
    kind recorded more often than the tree holds it was skipped by the C++ side (it keeps
    the first guard of a kind a manager gets), so only the first ones stay; a guard added
    through a call the recorder did not see would be missing, so that refuses."""
    classes = torch._C._dynamo.guards
    by_id: dict[int, dict[str, Any]] = {}

    def index(node: dict[str, Any]) -> None:
        by_id[node["id"]] = node
        for child in node["children"]:
            index(child)

    index(program["root"])
    spans: dict[int, dict[str, int]] = {}
    for relation in program["relations"]:
        kind = "NO_TENSOR_ALIASING" if relation["kind"] == "distinct" else "OBJECT_ALIASING"
        for node_id in relation["nodes"]:
            counts = spans.setdefault(node_id, {})
            counts[kind] = counts.get(kind, 0) + 1

    def walk(manager: Any) -> None:
        node = by_id.get(recorder.ids.get(id(manager), -1))
        where = manager.get_source() or "the frame"
        if node is None:
            raise UnsupportedGuards(f"a guard manager at {where!r} was not recorded")
        real: dict[str, int] = {}
        for leaf in manager.get_leaf_guards():
            real[type(leaf).__name__] = real.get(type(leaf).__name__, 0) + 1
        kept, seen = [], dict(spans.get(node["id"], {}))
        for leaf in node["leaves"]:
            kind = _leaf_class(leaf)
            if seen.get(kind, 0) < real.get(kind, 0):
                kept.append(leaf)
                seen[kind] = seen.get(kind, 0) + 1
        if seen != real:
            raise UnsupportedGuards(f"guards at {where!r}: {real} in the tree, {seen} recorded")
        node["leaves"] = kept
        children = list(manager.get_child_managers())
        if isinstance(manager, classes.DictGuardManager):
            for pair in manager.get_key_value_managers().values():
                children += [m for m in pair if m is not None]
        if len(children) != len(node["children"]):
            raise UnsupportedGuards(
                f"{len(children)} values guarded under {where!r}, {len(node['children'])} recorded"
            )
        for child in children:
            walk(child)

    walk(root)
    if len(root.get_epilogue_lambda_guards()) != len(program["epilogue"]):
        raise UnsupportedGuards("epilogue guards the recorder did not see")


def _attribute_reads(code: types.CodeType, alias: str) -> set[str]:
    """The attributes ``code`` (and code nested in it) reads off the global ``alias``;
    ``"?"`` for any other use of it."""
    import dis

    reads: set[str] = set()
    instructions = list(dis.get_instructions(code))
    for i, instruction in enumerate(instructions):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and instruction.argval == alias:
            after = instructions[i + 1] if i + 1 < len(instructions) else None
            if after is not None and after.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                reads.add(str(after.argval))
            else:
                reads.add("?")
        elif (
            instruction.opname in ("STORE_GLOBAL", "DELETE_GLOBAL") and instruction.argval == alias
        ):
            reads.add("?")
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            reads |= _attribute_reads(const, alias)
    return reads


def import_source(alias: str, module_name: str, codes: list[types.CodeType]) -> str:
    """The import source a Dynamo-free payload records for a frame's import alias: the
    module itself, or the stand-in for ``torch._dynamo.utils`` when ``codes`` read only
    what it provides; ``UnsupportedGuards`` for any other Dynamo module."""
    if module_name != "torch._dynamo" and not module_name.startswith("torch._dynamo."):
        return module_name
    reads = set().union(*(_attribute_reads(code, alias) for code in codes)) if codes else set()
    if module_name == DYNAMO_UTILS and reads <= _DYNAMO_UTILS_READS:
        return DYNAMO_UTILS_STAND_IN
    raise UnsupportedGuards(
        f"the compiled bytecode reads {module_name} ({', '.join(sorted(reads)) or 'as a value'})"
    )


def code_of(serialized: Any) -> types.CodeType:
    """The code object of a Dynamo ``SerializedCode``."""
    from torch._dynamo.package import SerializedCode

    code: types.CodeType = SerializedCode.to_code_object(serialized)
    return code


def builtins_of(scope: dict[str, Any]) -> dict[str, Any]:
    """The builtins dict Dynamo binds under its minted key in ``scope``."""
    from torch._dynamo.output_graph import get_builtins_dict

    return get_builtins_dict(scope)


def plain_code(serialized: Any) -> dict[str, Any]:
    """A Dynamo ``SerializedCode`` as plain fields (nested code likewise), which
    ``runtime.multigraph_guards.code_object`` rebuilds without Dynamo."""
    fields = {
        name: getattr(serialized, name)
        for name in (
            "co_argcount",
            "co_posonlyargcount",
            "co_kwonlyargcount",
            "co_nlocals",
            "co_stacksize",
            "co_flags",
            "co_code",
            "co_names",
            "co_varnames",
            "co_filename",
            "co_name",
            "co_qualname",
            "co_firstlineno",
            "co_linetable",
            "co_exceptiontable",
            "co_freevars",
            "co_cellvars",
        )
    }
    fields["co_consts"] = tuple(
        {"__code__": plain_code(c)} if type(c).__name__ == "SerializedCode" else c
        for c in serialized.co_consts
    )
    return fields
