"""Where two fingerprints (``value_fingerprints``) differ, and a fingerprint in words:
what a refusal of changed Python state names. Carried whole into make_fx's artifacts
after ``value_fingerprints`` (Dynamo's too: ``hook_words`` names what differs of a
hook); imports nothing.
"""

from __future__ import annotations

from typing import Any


def first_difference(old: Any, new: Any, path: str = "") -> tuple[str, Any, Any]:
    """Where two fingerprints first differ: the path below the value (an attribute
    ``.pool``, an index ``[0]``, a dict key ``['k']``, a function's ``.__defaults__``
    or closure variable, a partial's ``.keywords``) and the two fingerprints there."""
    if not (isinstance(old, tuple) and isinstance(new, tuple) and old and new):
        return path, old, new
    kind = old[0]
    if kind != new[0] or len(old) != len(new):
        return path, old, new
    if ((kind in ("object", "module") and len(old) == 3) or kind == "nn.Module") and old[1] == new[
        1
    ]:
        # An nn.Module's attributes the trace read are its third part too (a hook bound
        # to its module reads ``self.k``).
        before, after = dict(old[2]), dict(new[2])
        for key in sorted(before.keys() | after.keys()):
            if before.get(key) != after.get(key):
                if key in before and key in after:
                    return first_difference(before[key], after[key], f"{path}.{key}")
                return f"{path}.{key}", before.get(key, ("absent",)), after.get(key, ("absent",))
    if kind == "function" and old[1:3] == new[1:3]:
        if old[3] != new[3]:
            return f"{path} (its code)", old, new
        for i, part in ((4, "__defaults__"), (5, "__kwdefaults__")):
            if old[i] != new[i]:
                return first_difference(old[i], new[i], f"{path}.{part}")
        before, after = dict(old[6]), dict(new[6])
        for name in before.keys() | after.keys():
            if before.get(name) != after.get(name):
                return first_difference(
                    before.get(name, ("absent",)),
                    after.get(name, ("absent",)),
                    f"{path} (closure variable {name!r})",
                )
        if len(old) >= 9 and len(new) >= 9:
            if old[7] != new[7]:
                return f"{path} (the globals it runs in)", old, new
            before, after = dict(old[8]), dict(new[8])
            for name in sorted(before.keys() | after.keys()):
                if before.get(name) != after.get(name):
                    return first_difference(
                        before.get(name, ("absent",)),
                        after.get(name, ("absent",)),
                        f"{path}.{name}",
                    )
    if kind == "library object" and len(old) == len(new) == 4 and old[1] == new[1]:
        if old[3] == new[3]:  # no words of its own tell the two apart: what it holds
            return first_difference(old[2], new[2], f"{path} (the state it declares)")
        return path, old, new
    # What a view, a weak reference or a context variable reads through: followed, so
    # that the words name the value below (``view['k']``, ``ref().k``, ``VAR.get()``).
    through = {"mappingproxy": "", "weakref": "()", "context variable": ".get()"}.get(kind)
    if through is not None and len(old) == len(new) and old[1:-1] == new[1:-1]:
        inner_old, inner_new = old[-1], new[-1]
        if kind == "mappingproxy" and len(inner_old) == len(inner_new) == 1:
            inner_old, inner_new = inner_old[0], inner_new[0]
        return first_difference(inner_old, inner_new, path + through)
    if kind in ("partial", "method", "property", "staticmethod", "classmethod", "lru_cache"):
        parts = {
            "lru_cache": ("__wrapped__",),
            "partial": ("func", "args", "keywords"),
            "method": ("__func__", "__self__"),
            "property": ("fget", "fset", "fdel"),
        }.get(kind, ("__func__",))
        for part, a, b in zip(parts, old[1:], new[1:]):
            if a != b:
                return first_difference(a, b, f"{path}.{part}")
    body_old, body_new = old[-1], new[-1]
    if (
        len(old) == 2
        and str(kind).startswith(("builtins.", "collections."))
        and isinstance(body_old, tuple)
        and isinstance(body_new, tuple)
    ):
        if kind in ("builtins.dict", "collections.OrderedDict"):
            before, after = dict(body_old), dict(body_new)
            if list(before) == list(after):
                for key in before:
                    if before[key] != after[key]:
                        return first_difference(
                            before[key], after[key], f"{path}[{_readable(key)}]"
                        )
        elif len(body_old) == len(body_new) and kind != "builtins.set":
            for i, (a, b) in enumerate(zip(body_old, body_new)):
                if a != b:
                    return first_difference(a, b, f"{path}[{i}]")
    return path, old, new


def describe_value(fp: Any) -> str:
    """A fingerprint, readable in a message: literals and their containers as Python
    writes them, functions, classes and modules by name, objects by type."""
    text = _readable(fp)
    return text if len(text) <= 160 else text[:157] + "..."


def _readable(fp: Any) -> str:
    if not isinstance(fp, tuple) or not fp:
        return repr(fp)
    kind = fp[0]
    if kind in ("bool", "int", "str", "bytes", "NoneType") and len(fp) == 2:
        return repr(fp[1])
    if kind in ("float", "complex", "number"):
        return str(fp[-1])
    if kind == "function" and len(fp) >= 8 and fp[7] == ("globals", "other"):
        return f"function {fp[1]}.{fp[2]} running in other globals than its module's"
    if kind in ("function", "builtin"):
        return f"function {fp[1]}.{fp[2]}"
    if kind in ("class", "module", "op"):
        return f"{kind} {fp[1]}"
    if kind == "torch":
        return fp[2]
    if kind in ("tensor", "parameter") and len(fp) >= 4:
        # Every part the fingerprint compares, so two that differ read differently.
        grad = "" if len(fp) < 5 else (", requiring grad" if fp[4] else ", not requiring grad")
        return f"a {kind} of shape {fp[1]}, dtype {fp[2]} on {fp[3]}{grad}"
    if kind == "value" and len(fp) == 3:
        return str(fp[2])
    if kind == "builtins.bytearray" and len(fp) == 2:
        return str(fp[1])
    if kind == "collections.deque":
        return "deque([" + ", ".join(_readable(v) for v in fp[1]) + "])"
    if kind in ("builtins.list", "builtins.tuple", "builtins.set", "builtins.frozenset"):
        items = ", ".join(_readable(v) for v in fp[1])
        brackets = {"builtins.list": "[]", "builtins.tuple": "()"}.get(kind, "{}")
        return (
            brackets[0]
            + items
            + ("," if kind == "builtins.tuple" and len(fp[1]) == 1 else "")
            + brackets[1]
        )
    if kind in ("builtins.dict", "collections.OrderedDict"):
        return "{" + ", ".join(f"{_readable(k)}: {_readable(v)}" for k, v in fp[1]) + "}"
    if kind == "sentinel" and len(fp) == 3:
        held = " or ".join(f"{m}.{n}" for m, n in fp[2][:3])
        return f"the {fp[1]} bound to {held}" if held else f"an unnamed {fp[1]}"
    if kind == "object" and len(fp) == 3 and fp[2] == ():
        return f"a {fp[1]} that no module-level name holds"
    if kind == "enum" and len(fp) == 4:
        return f"{fp[1]}.{fp[2]} (value {_readable(fp[3])})"
    if kind in ("object", "nn.Module", "enum", "deep"):
        return f"a {fp[1]}" + (f".{fp[2]}" if kind == "enum" else "")
    if kind == "partial" and len(fp) == 4:
        return f"functools.partial({_readable(fp[1])}, ...)"
    if kind == "property" and len(fp) == 4:
        return f"a property getting with {_readable(fp[1])}"
    if kind in ("staticmethod", "classmethod", "cached_property", "lru_cache") and len(fp) == 2:
        return f"a {kind} of {_readable(fp[1])}"
    if kind == "method" and len(fp) == 3:
        return f"method {_readable(fp[1]).removeprefix('function ')} of {_readable(fp[2])}"
    if kind == "library object" and len(fp) == 4:
        return fp[3] or f"a {fp[1]}"
    if kind == "context variable" and len(fp) == 3:
        return f"context variable {fp[1]!r} set to {_readable(fp[2])}"
    if kind == "mappingproxy" and len(fp) == 2 and len(fp[1]) == 1:
        return f"mappingproxy({_readable(fp[1][0])})"
    if kind == "logger" and len(fp) == 3 and len(fp[2]) == 3:
        level, disabled, disable = (_readable(part) for part in fp[2])
        return (
            f"logger {fp[1]!r} at effective level {level}, disabled {disabled}, "
            f"logging.disable level {disable}"
        )
    if kind == "logger" and len(fp) == 2:
        return f"logger {fp[1]!r}"
    if kind == "memoryview" and len(fp) == 3:
        return f"a memoryview of {fp[2]!r}"
    if kind == "weakref" and len(fp) == 2:
        return f"a weak reference to {_readable(fp[1])}"
    if kind in ("absent", "unset", "a tensor or dead"):
        return kind
    if kind == "empty cell":
        return "an empty cell"
    if isinstance(kind, str) and "." in kind and len(fp) == 2:
        return f"a {kind}"  # another container or a number type: named, never raw
    return "a value"
