"""What a Dynamo trace read through fn's arguments beyond its serialized guards, checked
per call: a sub-builder of ``multigraph_dependencies.build_dependency_check``, emitted
verbatim into multi-graph artifacts (``capturing.carried.MultiGraph.driver``).

Recorded at capture by ``precompile.capturing.dynamo_dependencies``:

- objects compared by identity, reached from the arguments (``ARG_IDENTITIES``): a load
  resolves each by its name (module and qualified name, enum class and member, module
  global); every call evaluates the access paths from the arguments and compares by
  identity (a closure is compared by its code);
- signed zeros the trace computed with (``FLOAT_ZEROS``), the key order of ordered dicts
  it iterated (``ORDERED_DICTS``), and which arguments were one object
  (``ARG_RELATIONS``).

All rows are checked in one generated function, which binds fn's parameters once per
call; only a miss runs the row-by-row pass that names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

# >>> not emitted: Dynamo artifacts carry state_checks.code_fingerprint among their functions
from precompile.runtime.state_checks import code_fingerprint

# <<< not emitted

if TYPE_CHECKING:
    ARG_IDENTITIES: list[dict[str, Any]] = []
    ARG_RELATIONS: list[dict[str, Any]] = []
    FLOAT_ZEROS: list[dict[str, Any]] = []
    ORDERED_DICTS: list[dict[str, Any]] = []

    # precompile.runtime.refusal and the multi-graph driver's helpers, emitted with it.
    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    def import_user_module(name: str) -> Any: ...


def _binding_source(signature: Any, missing: Any) -> tuple[list[str], dict[str, Any]]:
    """Lines that bind fn's parameters as locals from ``__a`` (args) and ``__k``
    (kwargs), without inspect, and the namespace they read (``__D``, ``__N``)."""
    import inspect

    params = list(signature.parameters.values())
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    defaults = [missing if p.default is inspect.Parameter.empty else p.default for p in params]
    lines = []
    for i, p in enumerate(params):
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            lines.append(f"{p.name} = __a[{len(positional)}:]")
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            lines.append(f"{p.name} = {{k: v for k, v in __k.items() if k not in __N}}")
        elif p in positional:
            j = positional.index(p)
            lines.append(
                f"{p.name} = __a[{j}] if len(__a) > {j} else __k.get({p.name!r}, __D[{i}])"
            )
        else:
            lines.append(f"{p.name} = __k.get({p.name!r}, __D[{i}])")
    return lines, {"__D": defaults, "__N": frozenset(p.name for p in params)}


def build_argument_check(signature: Any) -> Any:
    """``check(args, kwargs)`` for what a call's arguments must hold beyond Dynamo's
    guards, or None when nothing (no per-call work): ``ARG_IDENTITIES`` and
    ``FLOAT_ZEROS``. One generated function binds fn's parameters once and evaluates
    every row's access path; only when it fails does the row-by-row pass run, which
    adopts what resolves now and raises PrecompileError naming the path, what is there
    and what was traced."""
    if not ARG_IDENTITIES and not FLOAT_ZEROS and not ORDERED_DICTS and not ARG_RELATIONS:
        return None
    missing = object()
    lines, namespace = _binding_source(signature, missing)
    identity_terms, identities_state, recheck_identities = _identity_rows(missing)
    zero_terms, recheck_zeros = _float_zero_rows(namespace)
    order_terms, recheck_orders = _ordered_dict_rows(namespace)
    relation_terms, recheck_relations = _relation_rows(namespace, missing)
    source = "def __arguments_ok(__a, __k, __E):\n    try:\n{}\n        return {}\n    except Exception:\n        return False\n".format(
        "\n".join("        " + line for line in lines),
        " and ".join([*identity_terms, *zero_terms, *order_terms, *relation_terms]),
    )
    exec(compile(source, "<precompile argument checks>", "exec"), namespace)
    arguments_ok = namespace["__arguments_ok"]

    def check(args: Any, kwargs: Any) -> None:
        if arguments_ok(args, kwargs, identities_state[0]):
            return
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return  # the call itself fails as eager would
        bound.apply_defaults()
        scope = dict(bound.arguments)
        recheck_identities(scope)
        recheck_zeros(scope)
        recheck_orders(scope)
        recheck_relations(scope)

    return check


def _relation_rows(namespace: dict[str, Any], missing: Any) -> tuple[list[str], Any]:
    """The term of ``ARG_RELATIONS`` for the generated check (binding what it reads
    into ``namespace``), and the row-by-row pass over a call's bound arguments.

    Each row is an access path from fn's arguments (or a module global) to an object
    the trace compared by identity that no other process can name (a config object
    ``copy.deepcopy`` keyed by ``id``), or one Dynamo found at two paths
    (``model.decoder.config`` is ``model.config``). What the trace learnt from those
    identities is which of the paths held one object, so every call checks exactly
    that: the objects at paths of one captured group are one object, and those of
    different groups are not."""
    if not ARG_RELATIONS:
        return [], lambda scope: None
    groups = tuple(row["group"] for row in ARG_RELATIONS)
    count = len(set(groups))
    paths = []
    for i, row in enumerate(ARG_RELATIONS):
        path = row["path"]
        if row.get("module"):
            namespace[f"__R{i}"] = vars(import_user_module(row["module"]))
            path = f"__R{i}" + path[1:]
        paths.append(path)
    compiled = [compile(path, "<precompile relation>", "eval") for path in paths]

    def grouped_as_captured(*values: Any) -> bool:
        seen: dict[int, int] = {}
        for value, group in zip(values, groups):
            if seen.setdefault(id(value), group) != group:
                return False
        return len(seen) == count

    namespace["__REL"] = grouped_as_captured
    term = "__REL({})".format(", ".join(f"({path})" for path in paths))

    def recheck(scope: dict[str, Any]) -> None:
        values = []
        for code in compiled:
            try:
                values.append(eval(code, namespace, scope))
            except Exception:
                values.append(missing)
        if grouped_as_captured(*values):
            return
        for j in range(len(values)):
            for i in range(j):
                same = groups[i] == groups[j]
                if (values[i] is values[j]) == same:
                    continue
                a, b = ARG_RELATIONS[i]["shown"], ARG_RELATIONS[j]["shown"]
                if values[i] is missing or values[j] is missing:
                    return  # the call's own guards refuse what is not there
                now = "two different objects" if same else "one object"
                then = "one object" if same else "two different objects"
                refuse(
                    f"precompile: `{a}` and `{b}` are {now} in this call; at capture they "
                    f"were {then}, and the trace compared them by identity (code such as "
                    f"`copy.deepcopy` or an `is` test depends on which paths hold one "
                    f"object), so this artifact serves only calls where they are {then}. "
                    + (
                        f"Make `{a}` the same object as `{b}` again (assign it, do not " f"copy it)"
                        if same
                        else f"Give `{a}` and `{b}` objects of their own"
                    )
                    + ", or capture again with them as they are now (re-emit the artifact)",
                    1,
                )

    return [term], recheck


def _float_zero_rows(namespace: dict[str, Any]) -> tuple[list[str], Any]:
    """The terms of ``FLOAT_ZEROS`` for the generated check (binding what they read into
    ``namespace``), and the row-by-row pass over a call's bound arguments: a number
    reached from an argument (or a module global) that was a signed zero at capture (a
    float equal to 0.0, a complex with a zero part) must be that very zero, compared by
    its literal fingerprint (``repr``). Dynamo's guard is ``==``, which the other sign
    passes, and ``x / s`` or ``copysign`` tell them apart. A value that differs
    otherwise is left to the guards."""
    kinds = {"float": float, "complex": complex}
    rows = []
    terms = []
    for i, row in enumerate(FLOAT_ZEROS):
        # A global's path (``G['EPS']``) reads that module's live globals, bound at load.
        path = row["path"]
        if row.get("module"):
            namespace[f"__G{i}"] = vars(import_user_module(row["module"]))
            path = f"__G{i}" + path[1:]
        kind = kinds[row["value"][0]]
        value = kind(row["value"][1])
        rows.append((row, compile(path, "<precompile signed zero>", "eval"), kind, value))
        terms.append(
            f"(type(__z := ({path})) is not __Z[{i}][0] or __z != __Z[{i}][1] "
            f"or repr(__z) == {row['value'][1]!r})"
        )
    namespace["__Z"] = tuple((kind, value) for _, _, kind, value in rows)

    def recheck(scope: dict[str, Any]) -> None:
        for row, path, kind, captured in rows:
            try:
                value = eval(path, namespace, scope)
            except Exception:
                continue  # the call's own guards refuse what is not there
            if type(value) is kind and value == captured and repr(value) != row["value"][1]:
                refuse(
                    f"precompile: `{row['shown']}` is {value!r} in this call but was "
                    f"{captured!r} at capture; the trace computed with {captured!r} (the "
                    f"sign of a zero reaches results: 1 / 0.0 is inf, 1 / -0.0 is -inf), "
                    f"and Dynamo's guard compares numbers with ==, which does not tell 0.0 "
                    f"from -0.0. Pass {captured!r}, or capture with {value!r} (re-emit the "
                    f"artifact)",
                    3,
                )

    return terms, recheck


def _ordered_dict_rows(namespace: dict[str, Any]) -> tuple[list[str], Any]:
    """The terms of ``ORDERED_DICTS`` for the generated check (binding what they read
    into ``namespace``), and the row-by-row pass over a call's bound arguments: an
    OrderedDict whose keys the guards compare by position must iterate in the order of
    its underlying dict, which is the order those guards read. ``move_to_end`` (or
    ``popitem`` and a re-insert) reorders the iteration and not the dict, so the guards
    would pass an OrderedDict that eager iterates in another order. A path that holds
    no OrderedDict now is left to the guards."""
    import collections

    namespace["__OD"] = collections.OrderedDict
    namespace["__dk"] = dict.keys
    rows = []
    terms = []
    for i, row in enumerate(ORDERED_DICTS):
        path = row["path"]
        if row.get("module"):
            namespace[f"__O{i}"] = vars(import_user_module(row["module"]))
            path = f"__O{i}" + path[1:]
        rows.append((row, compile(path, "<precompile ordered dict>", "eval")))
        terms.append(f"(not isinstance(__o := ({path}), __OD) or list(__o) == list(__dk(__o)))")

    def recheck(scope: dict[str, Any]) -> None:
        for row, path in rows:
            try:
                value = eval(path, namespace, scope)
            except Exception:
                continue  # the call's own guards refuse what is not there
            if not isinstance(value, collections.OrderedDict):
                continue
            order, stored = list(value), list(dict.keys(value))
            if order != stored:
                where = (
                    f"module {row['module']}'s global `{row['shown']}`"
                    if row.get("module")
                    else f"`{row['shown']}`"
                )
                refuse(
                    f"precompile: {where} is an OrderedDict that iterates as "
                    f"{order!r:.200} while its underlying dict holds the keys as "
                    f"{stored!r:.200} (move_to_end or popitem reordered it); the artifact's "
                    f"guards compare keys in the dict's order and the trace iterated it, so "
                    f"it would answer as if the keys came in that order. Pass "
                    f"OrderedDict(its items) built in the order you want, or capture "
                    f"again with it (re-emit the artifact)",
                    3,
                )

    return terms, recheck


def _identity_rows(missing: Any) -> tuple[list[str], list[Any], Any]:
    """The terms of ``ARG_IDENTITIES`` for the generated check (each compared with
    ``__E[i]``), the one-element list holding that tuple, and the row-by-row pass over a
    call's bound arguments: the objects at those access paths must be the ones the
    capture traced, compared by identity. The pass resolves names again (an object not
    importable at load is adopted once a call shows it by its name)."""
    import enum
    import operator

    def resolve(row: dict[str, Any]) -> Any:
        try:
            module = import_user_module(row["module"])
            found = operator.attrgetter(row["qualname"])(module)
            return found[row["member"]] if row["kind"] == "enum" else found
        except Exception:
            return missing

    def matches(row: dict[str, Any], value: Any) -> bool:
        """Whether ``value`` is what the capture traced at ``row``, by name."""
        if row["kind"] == "code":
            code = getattr(value, "__code__", None)
            return (
                getattr(value, "__module__", None),
                getattr(code, "co_qualname", None),
                code is not None and code_fingerprint(code),
            ) == (row["module"], row["qualname"], row["code"])
        target = resolve(row)
        return target is not missing and value is target

    def shown(value: Any) -> str:
        if isinstance(value, enum.Enum):
            return f"{type(value).__qualname__}.{value.name}"
        if value is missing:
            return "nothing (the path does not resolve)"
        import sys

        name = getattr(value, "__qualname__", None)
        module = getattr(value, "__module__", None)
        short = getattr(value, "__name__", None)
        if isinstance(module, str) and isinstance(short, str):
            if getattr(sys.modules.get(module), short, None) is value:
                return f"{module}.{short}"
        if isinstance(name, str) and isinstance(module, str) and name != "<lambda>":
            return f"{module}.{name}"
        if isinstance(name, str):
            code = getattr(value, "__code__", None)
            where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
            return f"{module}.{name}{where}"
        return f"another {type(value).__qualname__} instance"

    def captured(row: dict[str, Any]) -> str:
        if row["kind"] == "enum":
            return f"{row['qualname']}.{row['member']}"
        if row["kind"] == "global":
            return f"the object bound to {row['module']}.{row['qualname']}"
        if row["kind"] == "code":
            return f"a {row['module']}.{row['qualname']} function"
        return f"{row['module']}.{row['qualname']}"

    terms = [
        f"({row['path']}).__code__ is __E[{i}]"
        if row["kind"] == "code"
        else f"({row['path']}) is __E[{i}]"
        for i, row in enumerate(ARG_IDENTITIES)
    ]
    expected = [missing if row["kind"] == "code" else resolve(row) for row in ARG_IDENTITIES]
    state = [tuple(expected)]

    def recheck(scope: dict[str, Any]) -> None:
        for i, row in enumerate(ARG_IDENTITIES):
            try:
                value = eval(row["path"], {}, scope)
            except Exception:
                value = missing
            now = getattr(value, "__code__", missing) if row["kind"] == "code" else value
            if now is not missing and now is expected[i]:
                continue
            if value is not missing and matches(row, value):
                expected[i] = now
                continue
            refuse(
                f"precompile: `{row['shown']}` is {shown(value)} in this call; the capture "
                f"traced {captured(row)} there (the trace compared it by identity), and this "
                f"artifact serves only that. Pass what the capture traced, or capture again "
                f"with the new one (re-emit the artifact)"
            )
        state[0] = tuple(expected)

    return terms, state, recheck
