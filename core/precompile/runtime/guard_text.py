"""Dynamo's words turned into the user's: guard failures, access paths and frame names.

Dynamo describes a guard as ``tensor 'L['x']' size mismatch at index 0. expected 4,
actual 7`` and a continuation as ``torch_dynamo_resume_in_score_at_12``; a user wrote
``x`` and ``score``. Every message that names a guard or a frame -- a refused call, a
coverage gap, a capture report -- goes through here, so none of them shows ``L['x']``,
resume-function names or the ``___module_...`` globals Dynamo installs.

Imports only typing names at module level and the standard library inside: artifacts carry these functions
verbatim, and the language server uses them without torch.
"""

from __future__ import annotations

from typing import Any


def user_path(text: str) -> str:
    """``L['model']._modules['fc']._parameters['weight']`` -> ``model.fc.weight``;
    ``G['SCALE']`` -> ``SCALE``; ``___stack0`` -> ``the value carried across the break``."""
    import re

    text = re.sub(r"\b[LG]\[(['\"])(.+?)\1\]", r"\2", text)
    # A class attribute read through an instance, as the code spelled it:
    # ``dict(type(obj).__dict__)['attr']`` -> ``obj.attr``.
    text = re.sub(r"dict\(type\(([^()]+)\)\.__dict__\)\[(['\"])(\w+)\2\]", r"\1.\3", text)
    text = re.sub(r"\._(?:modules|parameters|buffers)\[(['\"])(.+?)\1\]", r".\2", text)
    text = re.sub(r"\._(?:modules|parameters|buffers)\b", "", text)
    text = re.sub(r"\.__dict__\[(['\"])(.+?)\1\]", r".\2", text)
    text = re.sub(r"___stack\d+", "the value carried across the graph break", text)
    text = re.sub(r"__import_(\w+)", lambda m: m.group(1).replace("_dot_", "."), text)
    text = re.sub(r"___unnamed_scope_\w+", "a function's globals", text)
    return re.sub(r"___module_\w+", "a module global", text)


#: What a dispatch key on a tensor means, for a refusal that names it: the keys a lazy
#: view or a subclass carries, and how to pass a plain tensor instead.
_KEY_MEANINGS = {
    "Negative": "a negative-bit view (its storage holds -x; pass `{name}.resolve_neg()`)",
    "Conjugate": "a conjugate view (pass `{name}.resolve_conj()`)",
    "ZeroTensor": "a zero tensor (pass `torch.zeros_like({name})`)",
    "Python": "a tensor subclass or functional wrapper (pass `{name}.as_subclass(torch.Tensor)`)",
    "SparseCPU": "a sparse tensor (pass `{name}.to_dense()`)",
    "SparseCUDA": "a sparse tensor (pass `{name}.to_dense()`)",
}


def dispatch_key_change(name: str, expected: str, actual: str) -> str:
    """A tensor guard's dispatch key set difference in the user's words: the keys the
    tensor gained or lost against the capture, each with what it means and the fix, not
    Dynamo's two raw ``DispatchKeySet(...)`` reprs."""
    import re

    def keys(text: str) -> list[str]:
        found = re.fullmatch(r"DispatchKeySet\((.*)\)", text.strip())
        return [k.strip() for k in (found.group(1) if found else text).split(",") if k.strip()]

    before, now = keys(expected), keys(actual)
    gained = [k for k in now if k not in before]
    lost = [k for k in before if k not in now]
    parts = []
    for key in gained:
        meaning = _KEY_MEANINGS.get(key)
        parts.append(
            f"it is {meaning.format(name=name)}" if meaning else f"it carries the {key} key"
        )
    if lost:
        parts.append(f"it lacks the {', '.join(lost)} key{'s' if len(lost) > 1 else ''}")
    what = "; ".join(parts) or f"its dispatch keys are {actual}"
    return (
        f"`{name}` is not the kind of tensor the capture saw: {what}; the graph was "
        f"traced for a plain tensor with the keys {', '.join(before)}"
    )


def typed_value(kind: str, shown: str) -> str:
    """A Python value with its type's name (``the float 2.0``; None as itself), for a
    refusal of a value specialized by type and value: ``2.0 == 2``, yet the capture
    took the int's path, so "is not 2" alone would read as a contradiction."""
    return shown if kind == "NoneType" else f"the {kind} {shown}"


def _value_at(path: str, f_locals: dict[str, Any]) -> Any:
    """The value a guard's user path (``n``, ``cfg[0]``, ``model.fc``) names in a frame's
    locals, read as the guard's own accessors read it; raises when it cannot be read."""
    import re

    match = re.match(r"\w+", path)
    if match is None:
        raise LookupError(path)
    value = f_locals[match.group(0)]
    rest = path[match.end() :]
    while rest:
        step = re.match(r"\.(\w+)|\[(-?\d+)\]|\[(['\"])(.*?)\3\]", rest)
        if step is None:
            raise LookupError(path)
        attr, index, _quote, key = step.groups()
        if attr is not None:
            value = getattr(value, attr)
        else:
            value = value[int(index)] if index is not None else value[key]
        rest = rest[step.end() :]
    return value


def guard_failure_text(raw: str, f_locals: dict[str, Any] | None = None) -> str:
    """One failing guard, as the user would say it, with where the capture read the value
    (Dynamo appends ``  # source line  # path:line in function`` to a guard). Given the
    frame's ``f_locals`` (where a call is refused), a value compared by type and value
    is shown with its type when that is what differs."""
    import ast
    import re

    def live_type(name: str) -> tuple[str, str] | None:
        """The live value's type name and repr, where the guard's path reads it."""
        if f_locals is None:
            return None
        try:
            value = _value_at(name, f_locals)
        except Exception:
            return None
        shown = repr(value)
        return type(value).__name__, shown if len(shown) <= 80 else shown[:77] + "..."

    def replaced_function(name: str, detail: str) -> str | None:
        """A guard on a function's own attribute (``f.__defaults__``, ``f.__code__``)
        fails when the function there was replaced: say that, about the function."""
        match = re.fullmatch(r"(.+)\.(__defaults__|__kwdefaults__|__code__|__closure__)", name)
        if match is None:
            return None
        owner, attr = match.groups()
        return (
            f"`{owner}` is not the function the capture traced (its `{attr}` {detail}): "
            f"the function registered or bound there was replaced. Restore it, or capture "
            f"again with the new one (re-emit the artifact)"
        )

    def words(text: str) -> str:
        match = re.fullmatch(r"___check_type_id\((.+?), \d+\), type=<class '(.+?)'>", text)
        if match:
            live = live_type(match.group(1))
            said = replaced_function(
                match.group(1),
                f"is {typed_value(*live) if live else 'of another type'}, where the "
                f"capture's was a {match.group(2)}",
            )
            if said:
                return said
        if match:
            name, expected = match.groups()
            live = live_type(name)
            now = f" (it is {typed_value(*live)})" if live else ""
            return (
                f"`{name}` is not a {expected.rsplit('.', 1)[-1]} ({expected}), the type the "
                f"capture saw{now}"
            )
        match = re.fullmatch(r"___check_obj_id\((.+?), \d+\)", text)
        if match and replaced_function(match.group(1), "differs"):
            return str(replaced_function(match.group(1), "differs"))
        if match:
            return f"`{match.group(1)}` is not the object the capture saw"
        match = re.fullmatch(
            r"tensor '(.+?)' (size|stride) mismatch at index (\d+)\. expected (\S+), actual (\S+)",
            text,
        )
        if match:
            name, what, dim, expected, actual = match.groups()
            return f"`{name}` has {what} {actual} at dim {dim}; the capture saw {expected}"
        match = re.fullmatch(
            r"tensor '(.+?)' dispatch key set mismatch\. expected (.+), actual (.+)", text
        )
        if match and "Autograd" in match.group(2) and "Autograd" not in match.group(3):
            # Autograd keys missing: an inference tensor passed to a call made outside
            # inference mode (under it, a served call shows its guards the tensor's
            # ordinary keys: _compat.prelude._ordinary_dispatch).
            return (
                f"`{match.group(1)}` is an inference tensor (made under "
                f"torch.inference_mode()), and the capture saw an ordinary tensor, which "
                f"Dynamo's guards tell apart outside inference mode. Call the artifact "
                f"under torch.inference_mode(), make the tensor outside it, or capture "
                f"with MakeFxTracer, whose artifacts serve both"
            )
        if match:
            return dispatch_key_change(*match.groups())
        match = re.fullmatch(
            r"tensor '(.+?)' requires_grad mismatch\. expected requires_grad=(\d)\b.*", text
        )
        if match:
            name, expected = match.group(1), bool(int(match.group(2)))
            return (
                f"`{name}` has requires_grad={not expected}; the capture saw "
                f"requires_grad={expected}"
            )
        match = re.fullmatch(
            r"tensor '(.+?)' (\w[\w ]*?) mismatch\. expected (.+), actual (.+)", text
        )
        if match:
            name, what, expected, actual = match.groups()
            return f"`{name}` has {what} {actual}; the capture saw {expected}"
        match = re.fullmatch(r"tensor '(.+?)' rank mismatch\. expected (\d+), actual (\d+)", text)
        if match:
            name, expected, actual = match.groups()
            return f"`{name}` has {actual} dims; the capture saw {expected}"
        match = re.fullmatch(r"([\w.]+(?:\[[^\]]+\])*) is ([\w.]+(?:\[[^\]]+\])*)", text)
        if match:
            # One object Dynamo met at two paths (DUPLICATE_INPUT), traced as one.
            first, second = match.groups()
            return (
                f"`{first}` and `{second}` are two different objects; at capture they were "
                f"one object, which the trace read through both"
            )
        match = re.fullmatch(r"\(?type\((.+?)\) is \w+ and __math_isnan\(\1\)\)?", text)
        if match:
            # A NaN equals nothing: Dynamo guards one it specialized on with isnan.
            return f"`{match.group(1)}` is not nan, the value the capture specialized on"
        match = re.fullmatch(r"([\w.\[\]'\" ]+?) == (.+)", text)
        if match and replaced_function(match.group(1), f"is not {match.group(2)}"):
            return str(replaced_function(match.group(1), f"is not {match.group(2)}"))
        if match:
            name, value = match.groups()
            shown = name if " " in name else f"`{name}`"
            live = live_type(name)
            try:
                captured_kind = type(ast.literal_eval(value)).__name__
            except (ValueError, SyntaxError):
                captured_kind = None
            if live and captured_kind and live[0] != captured_kind:
                return (
                    f"{shown} is {typed_value(*live)}; the capture saw "
                    f"{typed_value(captured_kind, value)} (a Python value is specialized by "
                    f"type and value)"
                )
            return f"{shown} is not {value}, the value the capture specialized on"
        match = re.fullmatch(r"len\((.+)\) (==|!=) (\d+)", text)
        if match:
            name, _, count = match.groups()
            return f"`{name}` does not hold {count} items, as it did at capture"
        match = re.fullmatch(r"TYPE_MISMATCH\((.+)\)", text)
        if match:
            return f"`{match.group(1)}` is not of the type the capture saw"
        match = re.fullmatch(r"list\(dict\.keys\((.+)\)\)\[(\d+)\] == (.+)", text)
        if match:
            name, index, key = match.groups()
            return (
                f"`{name}` does not have {key} as its key number {index}: its keys differ "
                f"from the capture's, or are in another order"
            )
        match = re.fullmatch(r"(not )?___dict_contains\((['\"])(.+?)\2, (.+?)\.__dict__\)", text)
        if match:
            negated, _quote, attr, owner = match.groups()
            # As Python spells it: a Sequential's child ``model.0`` is ``model[0]``.
            owner = re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", owner)
            try:
                cls = type(_value_at(owner, f_locals or {}))
                on_class = f"`{cls.__name__}.{attr}`"
            except Exception:
                on_class = f"the class's `{attr}`"
            if negated:
                return (
                    f"`{owner}.{attr}` was set on the instance (an attribute in "
                    f"{owner}.__dict__ shadows {on_class}); the capture ran {on_class}. "
                    f"Delete it (del {owner}.{attr}), or set it before capturing and "
                    f"capture again"
                )
            return (
                f"`{owner}.{attr}` is no longer in {owner}.__dict__, where the capture read "
                f"it. Set it on the instance again, or capture again without it"
            )
        match = re.fullmatch(r"not ([\w.]+(?:\[[^\]]+\])*)", text)
        if match:
            return f"`{match.group(1)}` is not empty, as it was at capture"
        match = re.fullmatch(
            r"expected type of '(.+?)' to be a tensor type, ' but found <class '(.+?)'>", text
        )
        if match:
            name, found = match.groups()
            # Torch's words name the type found, not the one captured (a Parameter
            # captured and a plain tensor passed reads the same as the reverse).
            return (
                f"`{name}` is a {found}, not the exact tensor type the capture saw (Dynamo's "
                f"guards compare it: an nn.Parameter, a plain torch.Tensor and a tensor "
                f"subclass differ)"
            )
        if text == "Duplicate tensor found where not expected!":
            return (
                "two arguments (or an argument and a parameter or buffer of the model) are "
                "one tensor, which they were not at capture"
            )
        match = re.fullmatch(r"KeyError on (.+)\[(['\"].*['\"])\]", text)
        if match:
            return f"`{match.group(1)}` has no key {match.group(2)}; the capture read that key"
        match = re.fullmatch(r"KeyError on (.+)", text)
        if match:
            return f"{match.group(1)} is not defined in this process"
        return text

    # Dynamo appends where the guard came from ("  # x = f()  # file.py:34 in <frame>").
    code, *comments = re.split(r"\s+# ", raw.strip())
    where = ""
    if comments:
        match = re.fullmatch(r"\S*?([^/\s]+:\d+) in (\S+)(?: \(HINT.*\))?", comments[-1].strip())
        if match:
            function = re.sub(r"^torch_dynamo_resume_in_(.+)_at_\d+$", r"\1", match.group(2))
            where = f" (read at {match.group(1)} in `{function}`)"
    # A module's own table (``_modules``, ``_parameters``, ``_buffers``) of another type:
    # ``user_path`` says ``model.fc`` for ``model._modules['fc']`` and drops a bare
    # table, which would name the module itself here; name the table.
    match = re.fullmatch(
        r"___check_type_id\((.+?)\.(_modules|_parameters|_buffers), \d+\), "
        r"type=<class '(.+?)'>",
        code.strip(),
    )
    if match:
        owner, table, expected = user_path(match.group(1)), match.group(2), match.group(3)
        path = f"{owner}.{table}"
        live = live_type(path)
        now = f"an {live[0]}" if live and live[0][0] in "AEIOU" else f"a {live[0]}" if live else ""
        what = {"_modules": "submodules", "_parameters": "parameters", "_buffers": "buffers"}
        return (
            f"`{path}` (the dict of `{owner}`'s {what[table]}) was replaced by "
            f"{now or 'another type'}, where the capture saw a plain {expected}; Dynamo "
            f"guards its exact type. Set it back to a {expected} (`{path} = "
            f"{expected}({path})` keeps its order), or capture again with it (re-emit the "
            f"artifact)" + where
        )
    return words(user_path(code.strip())) + where


def frame_label(name: str, line: int = 0) -> str:
    """``torch_dynamo_resume_in_score_at_12`` -> ``the code after line 12 of `score` ``."""
    import re

    match = re.fullmatch(r"torch_dynamo_resume_in_(.+)_at_(\d+)", name)
    if match:
        return f"the code after line {match.group(2)} of `{match.group(1)}`"
    return f"`{name}`" + (f" (line {line})" if line else "")
