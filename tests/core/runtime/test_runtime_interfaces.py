"""The interfaces between emitted runtime modules are checked, not just kept.

An artifact is one flat namespace: the runtime modules emitted into it (runtime/single_graph.py,
runtime/multigraph.py, ...) reach each other, the prelude and the metadata through names
in that namespace, declared for the type checker under ``if TYPE_CHECKING:``. Nothing
else connects a declaration with what the artifact binds, so a renamed parameter or a
dropped helper would type-check and fail only at serve time. Here each kind of artifact
is emitted and executed, and every declaration of every runtime module it carries must
name something the artifact binds, of the declared kind: a function with the declared
parameters (names, kinds, which have defaults) and, where the declaration is not
``Any``, the same annotations; a value of the declared type.
"""

from __future__ import annotations

import ast
import inspect
import pkgutil
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import dynamo_models, fx_grad_inputs, installed_models, models
from tests.harness import capture_pair

CORE = Path(precompile.__file__).resolve().parent


def _stubs(path: Path) -> list[ast.stmt]:
    """The declarations under a module's top-level ``if TYPE_CHECKING:``, less imports."""
    tree = ast.parse(path.read_text())
    return [
        stmt
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for stmt in node.body
        if isinstance(stmt, ast.FunctionDef | ast.AnnAssign)
    ]


def _functions(path: Path) -> dict[str, set[str]]:
    """The functions a runtime module defines at top level, each with the names its body
    reads: an emitter may carry a module whole or a few of its functions, and a
    declaration is checked wherever a carried function reads it."""
    tree = ast.parse(path.read_text())
    return {
        n.name: {m.id for m in ast.walk(n) if isinstance(m, ast.Name)}
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
    }


RUNTIME_MODULES = sorted(p for p in CORE.rglob("*.py") if _stubs(p))


def _parameters(args: ast.arguments) -> list[tuple[str, str, bool, str | None]]:
    """(name, kind, has a default, annotation text) per parameter of a declaration."""
    rows: list[tuple[str, str, bool, str | None]] = []
    positional = args.posonlyargs + args.args
    first_default = len(positional) - len(args.defaults)
    for i, a in enumerate(positional):
        kind = "POSITIONAL_ONLY" if i < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        rows.append((a.arg, kind, i >= first_default, _text(a.annotation)))
    if args.vararg:
        rows.append((args.vararg.arg, "VAR_POSITIONAL", False, _text(args.vararg.annotation)))
    for a, default in zip(args.kwonlyargs, args.kw_defaults):
        rows.append((a.arg, "KEYWORD_ONLY", default is not None, _text(a.annotation)))
    if args.kwarg:
        rows.append((args.kwarg.arg, "VAR_KEYWORD", False, _text(args.kwarg.annotation)))
    return rows


def _shape(
    declared: tuple[str, str, bool, str | None], actual: tuple[str, str, bool, str | None]
) -> tuple[str, str, bool]:
    """A declared positional-only parameter stands for whatever name the definition
    gives it (the graph's ``call`` is ``flat_inputs`` in FX code, ``args`` in Inductor's)."""
    name, kind, default, _ = declared
    if kind == "POSITIONAL_ONLY" and actual[1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"):
        return actual[0], actual[1], default
    return name, kind, default


def _text(annotation: ast.expr | None) -> str | None:
    return None if annotation is None else ast.unparse(annotation)


def _live_parameters(fn: Callable[..., Any]) -> list[tuple[str, str, bool, str | None]] | None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: only its existence is checked
    return [
        (
            p.name,
            p.kind.name,
            p.default is not inspect.Parameter.empty,
            None if p.annotation is inspect.Parameter.empty else str(p.annotation),
        )
        for p in signature.parameters.values()
    ]


_VALUE_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "bool": bool,
    "float": (int, float),
    "list": list,
    "dict": dict,
    "tuple": tuple,
    "set": (set, frozenset),
}


def _problems(stub: ast.stmt, namespace: dict[str, Any], module: str) -> list[str]:
    if isinstance(stub, ast.FunctionDef):
        where = f"{module}: {stub.name}"
        if stub.name not in namespace:
            return [f"{where} is declared but the artifact binds no such name"]
        live = namespace[stub.name]
        if not callable(live):
            return [f"{where} is declared a function but the artifact binds {live!r}"]
        actual = _live_parameters(live)
        if actual is None:
            return []
        declared = _parameters(stub.args)
        if [_shape(d, a) for d, a in zip(declared, actual)] != [a[:3] for a in actual] or len(
            declared
        ) != len(actual):
            return [f"{where}: declared parameters {declared} but the artifact's are {actual}"]
        return [
            f"{where}: parameter {d[0]!r} is declared {d[3]!r} but defined {a[3]!r}"
            for d, a in zip(declared, actual)
            if d[3] not in (None, "Any") and a[3] is not None and d[3] != a[3]
        ]
    assert isinstance(stub, ast.AnnAssign) and isinstance(stub.target, ast.Name)
    name, annotation = stub.target.id, ast.unparse(stub.annotation)
    where = f"{module}: {name}: {annotation}"
    if name not in namespace:
        return [f"{where} is declared but the artifact binds no such name"]
    value = namespace[name]
    head = annotation.split("[", 1)[0].split(" | ", 1)[0]
    optional = "None" in annotation.split(" | ")
    if head.startswith(("Callable", "typing.Callable")):
        ok = callable(value)
    elif head in _VALUE_TYPES:
        ok = isinstance(value, _VALUE_TYPES[head]) or (optional and value is None)
    else:
        ok = True  # Any, a module, a torch type: existence is what is checked
    return [] if ok else [f"{where} is bound to a {type(value).__name__}"]


def _execute(artifact: str) -> dict[str, Any]:
    """Execute the artifact's text as a user without this package would (with its
    ``__file__``, docs/artifact-format.md): the namespace it binds."""
    namespace: dict[str, Any] = {"__file__": artifact, "__name__": "precompile_interface_check"}
    exec(compile(Path(artifact).read_text(), artifact, "exec"), namespace)
    return namespace


def _artifacts(directory: Path) -> dict[str, str]:
    """One artifact of each kind the emitters write."""
    torch.manual_seed(0)
    out: dict[str, str] = {}
    mlp, x = models.MLP().eval(), torch.randn(4, 8)
    out["make_fx eager"] = capture_pair(models.mlp_fn, mlp, x, directory=directory, name="fx")[0]
    out["make_fx inductor"] = capture_pair(
        models.mlp_fn, mlp, x, directory=directory, name="fxi", backend="inductor"
    )[0]
    reg = models.Regressor()
    out["make_fx training"] = capture_pair(
        models.train_step_fn, reg, torch.randn(3, 5), torch.randn(3, 1),
        directory=directory, name="fxt", training=True,
    )[0]  # fmt: skip
    out["make_fx inductor writing an input"] = capture_pair(
        models.inplace_fn, torch.randn(3, 4), 2.0, directory=directory, name="fxw",
        backend="inductor",
    )[0]  # fmt: skip
    grad_model, grad_inputs = fx_grad_inputs.build("mlp")
    out["make_fx grad inputs"] = capture_pair(
        fx_grad_inputs.mlp_call, grad_model, *grad_inputs, directory=directory, name="fxg",
    )[0]  # fmt: skip
    out["dynamo eager"] = capture_pair(
        dynamo_models.explicit_break, mlp, x, directory=directory, name="dyn",
        tracer=precompile.DynamoTracer(),
    )[0]  # fmt: skip
    out["dynamo inductor training"] = capture_pair(
        dynamo_models.train_step_break, models.Regressor(), torch.randn(3, 5), torch.randn(3, 1),
        directory=directory, name="dyni", tracer=precompile.DynamoTracer(),
        backend="inductor", training=True,
    )[0]  # fmt: skip
    out["dynamo installed"] = capture_pair(
        installed_models.child_break, installed_models.ChattyNet().eval(), x,
        directory=directory, name="inst", tracer=precompile.DynamoTracer(),
    )[0]  # fmt: skip
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _artifacts(tmp_path_factory.mktemp("interfaces"))


def test_every_runtime_declaration_matches_what_each_artifact_binds(
    artifacts: dict[str, str],
) -> None:
    """A declaration an artifact binds must match it; one that a carried function reads
    only on some paths (the training runtime, the input-aliasing check) may be absent
    from an artifact that never takes them, but some kind of artifact must bind it, or
    the declaration stands for nothing."""
    problems: list[str] = []
    bound_somewhere: dict[tuple[str, str], bool] = {}
    for kind, artifact in artifacts.items():
        text = Path(artifact).read_text()
        namespace = _execute(artifact)
        for module in RUNTIME_MODULES:
            read = {
                name
                for function, names in _functions(module).items()
                if f"\ndef {function}(" in text
                for name in names
            }
            module_name = str(module.relative_to(CORE))
            for stub in _stubs(module):
                name = _declared_name(stub)
                if name not in read:
                    continue
                key = (module_name, name)
                bound_somewhere[key] = bound_somewhere.get(key, False) or name in namespace
                if name in namespace:
                    problems += [f"[{kind}] {p}" for p in _problems(stub, namespace, module_name)]
        namespace.get("_unload", lambda: None)()
    declared = {
        (str(m.relative_to(CORE)), _declared_name(stub))
        for m in RUNTIME_MODULES
        for stub in _stubs(m)
    }
    problems += [
        f"{m}: {n} is declared but no artifact kind carries a function reading it"
        for m, n in sorted(declared - set(bound_somewhere))
    ]
    problems += [
        f"{m}: {n} is declared but no artifact kind binds it"
        for (m, n), ok in sorted(bound_somewhere.items())
        if not ok
    ]
    assert not problems, "\n".join(problems)


def _declared_name(stub: ast.stmt) -> str:
    if isinstance(stub, ast.FunctionDef):
        return stub.name
    assert isinstance(stub, ast.AnnAssign) and isinstance(stub.target, ast.Name)
    return stub.target.id


def test_a_declaration_that_drifted_from_its_definition_is_caught() -> None:
    """The check itself: a renamed parameter, a missing name, a value of another type."""
    namespace: dict[str, Any] = {
        "refuse": lambda text, invariant=None: None,
        "FN_NAME": 3,
    }
    source = (
        "def refuse(message: str, invariant: int | None = None) -> NoReturn: ...\n"
        "def gone() -> None: ...\n"
        "FN_NAME: str = ''\n"
    )
    stubs = ast.parse(source).body
    found = [p for stub in stubs for p in _problems(stub, namespace, "m.py")]
    assert len(found) == 3, found
    assert "declared parameters" in found[0] and "no such name" in found[1]
    assert "bound to a int" in found[2]


def _documented_keys() -> set[str]:
    """Every metadata key docs/artifact-format.md names."""
    page = (CORE.parents[1] / "docs" / "artifact-format.md").read_text()
    documented = set(re.findall(r"`(_?[A-Z][A-Z0-9_]+)`", page))
    # A table row may abbreviate a family: `USER_INPUT_SHAPES`, `_DTYPES`, `_DEVICES`.
    for row in re.findall(r"^\|(.*)\|", page, flags=re.M):
        base = None
        for name in re.findall(r"`(_?[A-Z][A-Z0-9_]*)`", row):
            if name.startswith("_") and base is not None:
                documented.add(base + name)
            elif "_" in name.strip("_"):
                base = name.rsplit("_", 1)[0]
    return documented


def test_docs_artifact_format_lists_every_metadata_key_the_emitters_write(
    artifacts: dict[str, str],
) -> None:
    """docs/artifact-format.md is the reference for tools that read artifacts without
    executing them (``precompile inspect``, the language server): a key an emitter writes
    and the page does not name is undocumented format."""
    documented = _documented_keys()
    missing: dict[str, list[str]] = {}
    for kind, artifact in artifacts.items():
        for key in precompile.inspect_artifact(artifact):
            if key not in documented:
                missing.setdefault(key, []).append(kind)
    assert not missing, f"metadata keys docs/artifact-format.md does not name: {missing}"


def _carried_module(part: Any) -> str:
    return part.__name__ if inspect.ismodule(part) else part.__module__


def test_every_runtime_module_is_carried_by_an_artifact_kind_and_nothing_else_is() -> None:
    """``capturing.carried`` is the one declaration of what artifacts carry: every module
    of ``precompile.runtime`` is in some kind's list (the wing holds only emitted code),
    and what a list takes from outside the wing is one of the few places that hold
    emitted code by design (``_compat.runtime`` names private torch; ``artifact.bytecode.compiled_source`` reads the cache)."""
    import precompile.runtime
    from precompile.capturing.carried import every_section

    runtime = {
        m.name for m in pkgutil.iter_modules(precompile.runtime.__path__, "precompile.runtime.")
    }
    carried = {_carried_module(p) for section in every_section() for p in section.parts}
    assert runtime - carried == set(), "runtime modules no artifact kind carries"
    assert carried - runtime == {
        "precompile._compat.runtime",
        "precompile.artifact.bytecode",
    }


_DECLARED = re.compile(r"carried\.(SingleGraph|MultiGraph|CaptureTime)\.\w+(\(|$)")


def test_the_emitters_carry_only_declared_sections() -> None:
    """Every ``runtime_source(...)`` call on the capture side names a section of
    ``capturing.carried`` (or a lowered graph's, which a backend took from there): no
    emitter picks runtime functions of its own (mypy holds the type; this holds the
    spelling, so a list built in place is caught too)."""
    found: list[str] = []
    for path in sorted((CORE / "capturing").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "runtime_source"
            ):
                for arg in node.args:
                    text = ast.unparse(arg)
                    if not (_DECLARED.match(text) or text == "*lowered.runtime"):
                        found.append(f"{path.name}:{node.lineno}: runtime_source({text})")
    assert not found, found


def _conforms(value: Any, hint: Any) -> bool:
    """``value`` (a literal read back from an artifact) is of the schema's type, to the
    depth the schema states it: the outer type, and the items of a ``list[...]``."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_conforms(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, hint) and not (hint is int and isinstance(value, bool))


def test_every_artifact_writes_exactly_the_metadata_schema_of_its_kind(
    artifacts: dict[str, str],
) -> None:
    """``artifact.schema`` is the one statement of each kind's metadata: an artifact
    carries every required key of its kind's schema, no key the schema lacks, and each
    value of the schema's type."""
    from precompile.artifact.schema import SCHEMAS

    problems: list[str] = []
    for kind, artifact in artifacts.items():
        metadata = precompile.inspect_artifact(artifact)
        schema = SCHEMAS[metadata["SERVING_MODE"]]
        hints = typing.get_type_hints(schema)
        required = set(schema.__required_keys__)  # type: ignore[attr-defined]
        problems += [f"[{kind}] {k} missing" for k in sorted(required - set(metadata))]
        problems += [f"[{kind}] {k} not in {schema.__name__}" for k in metadata if k not in hints]
        problems += [
            f"[{kind}] {k} = {v!r:.60} is not {hints[k]}"
            for k, v in metadata.items()
            if k in hints and not _conforms(v, hints[k])
        ]
    assert not problems, "\n".join(problems)


def test_docs_artifact_format_lists_every_key_of_every_schema() -> None:
    """Every key a schema declares is documented, including those only some captures
    write (``EAGER_FRAMES``), which the emitted sample above may not carry."""
    from precompile.artifact.schema import SCHEMAS

    missing = {
        (schema.__name__, key)
        for schema in SCHEMAS.values()
        for key in typing.get_type_hints(schema)
        if key not in _documented_keys()
    }
    assert not missing, f"schema keys docs/artifact-format.md does not name: {sorted(missing)}"


def test_one_code_digest_identifies_code_for_every_check() -> None:
    """make_fx's state checks, Dynamo's identity rows and the library surface name a
    function's code by one digest (``state_checks.code_fingerprint``): what the code does
    (a constant changed is another function), not where it sits (a function moved by an
    edit above it is the same one)."""
    from precompile.runtime import multigraph_argument_checks, state_checks, surface_checks

    def code_at(line: int, constant: float) -> Any:
        source = "\n" * line + f"def shape(t):\n    return t * {constant}\n"
        return compile(source, "<test>", "exec").co_consts[0]

    digest = state_checks.code_fingerprint
    assert multigraph_argument_checks.code_fingerprint is digest
    assert surface_checks.code_fingerprint is digest
    assert digest(code_at(3, 0.5)) == digest(code_at(40, 0.5))
    assert digest(code_at(3, 0.5)) != digest(code_at(3, 4.0))


def test_the_hook_dicts_are_named_in_one_place() -> None:
    """Both tracers' hook records and checks read the hook dicts' names from one place
    (``_compat.prelude.MODULE_HOOK_DICTS`` / ``GLOBAL_HOOK_DICTS``, bound in every
    artifact's prelude): no other module lists them again, so make_fx and Dynamo cannot
    drift on which hooks count."""
    from precompile._compat import prelude

    names = set(prelude.MODULE_HOOK_DICTS) | set(prelude.GLOBAL_HOOK_DICTS)
    root = Path(precompile.__file__).parent
    listed = []
    for path in sorted(root.rglob("*.py")):
        if path == Path(prelude.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                spelled = [
                    e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names
                ]
                if len(spelled) >= 2:
                    listed.append(f"{path.relative_to(root)}:{node.lineno}")
    assert listed == [], listed
    assert prelude.GLOBAL_MODULE_HOOK_NAMES[:4] == prelude.GLOBAL_HOOK_DICTS
    namespace: dict[str, Any] = {}
    exec(prelude.ARTIFACT_PRELUDE, namespace)
    assert namespace["MODULE_HOOK_DICTS"] == prelude.MODULE_HOOK_DICTS
    assert namespace["GLOBAL_HOOK_DICTS"] == prelude.GLOBAL_HOOK_DICTS


def test_the_prelude_binds_each_name_once_for_artifacts_and_the_capture() -> None:
    """The names the capture imports from ``_compat.prelude`` to run runtime code in
    process are the very objects the artifact's prelude text binds: one binding each."""
    from precompile._compat import prelude

    namespace: dict[str, Any] = {}
    exec(prelude.ARTIFACT_PRELUDE, namespace)
    shared = [
        name
        for name in namespace
        if not name.startswith("_") and name in vars(prelude) and name != "torch"
    ]
    assert {"dispatch_mode_depth", "disable_dispatch_modes", "MODULE_HOOK_DICTS"} <= set(shared)
    for name in shared:
        ours, theirs = getattr(prelude, name), namespace[name]
        assert ours is theirs or ours == theirs, name
