"""Dynamo's words turned into the user's: guard failures, access paths and frame names.

Dynamo describes a guard as ``tensor 'L['x']' size mismatch at index 0. expected 4,
actual 7`` and a continuation as ``torch_dynamo_resume_in_score_at_12``; a user wrote
``x`` and ``score``. Every message that names a guard or a frame -- a refused call, a
coverage gap, a capture report -- goes through here, so none of them shows ``L['x']``,
resume-function names or the ``___module_...`` globals Dynamo installs.

Imports nothing at module level and only ``re`` inside: artifacts carry these functions
verbatim, and the language server uses them without torch.
"""

from __future__ import annotations


def user_path(text: str) -> str:
    """``L['model']._modules['fc']._parameters['weight']`` -> ``model.fc.weight``;
    ``G['SCALE']`` -> ``SCALE``; ``___stack0`` -> ``the value carried across the break``."""
    import re

    text = re.sub(r"\b[LG]\[(['\"])(.+?)\1\]", r"\2", text)
    text = re.sub(r"\._(?:modules|parameters|buffers)\[(['\"])(.+?)\1\]", r".\2", text)
    text = re.sub(r"\._(?:modules|parameters|buffers)\b", "", text)
    text = re.sub(r"\.__dict__\[(['\"])(.+?)\1\]", r".\2", text)
    text = re.sub(r"___stack\d+", "the value carried across the graph break", text)
    text = re.sub(r"__import_(\w+)", lambda m: m.group(1).replace("_dot_", "."), text)
    text = re.sub(r"___unnamed_scope_\w+", "a function's globals", text)
    return re.sub(r"___module_\w+", "a module global", text)


def guard_failure_text(raw: str) -> str:
    """One failing guard, as the user would say it, with where the capture read the value
    (Dynamo appends ``  # source line  # path:line in function`` to a guard)."""
    import re

    def words(text: str) -> str:
        match = re.fullmatch(r"___check_type_id\((.+?), \d+\), type=<class '(.+?)'>", text)
        if match:
            name, expected = match.groups()
            return (
                f"`{name}` is not a {expected.rsplit('.', 1)[-1]} ({expected}), the type the "
                f"capture saw"
            )
        match = re.fullmatch(r"___check_obj_id\((.+?), \d+\)", text)
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
            r"tensor '(.+?)' (\w[\w ]*?) mismatch\. expected (.+), actual (.+)", text
        )
        if match:
            name, what, expected, actual = match.groups()
            return f"`{name}` has {what} {actual}; the capture saw {expected}"
        match = re.fullmatch(r"tensor '(.+?)' rank mismatch\. expected (\d+), actual (\d+)", text)
        if match:
            name, expected, actual = match.groups()
            return f"`{name}` has {actual} dims; the capture saw {expected}"
        match = re.fullmatch(r"\(?type\((.+?)\) is \w+ and __math_isnan\(\1\)\)?", text)
        if match:
            # A NaN equals nothing: Dynamo guards one it specialized on with isnan.
            return f"`{match.group(1)}` is not nan, the value the capture specialized on"
        match = re.fullmatch(r"([\w.\[\]'\" ]+?) == (.+)", text)
        if match:
            name, value = match.groups()
            shown = name if " " in name else f"`{name}`"
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
        match = re.fullmatch(r"not ([\w.]+(?:\[[^\]]+\])*)", text)
        if match:
            return f"`{match.group(1)}` is not empty, as it was at capture"
        match = re.fullmatch(
            r"expected type of '(.+?)' to be a tensor type, ' but found <class '(.+?)'>", text
        )
        if match:
            name, found = match.groups()
            return f"`{name}` is a {found}, where the capture saw a plain torch.Tensor"
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
    return words(user_path(code.strip())) + where


def frame_label(name: str, line: int = 0) -> str:
    """``torch_dynamo_resume_in_score_at_12`` -> ``the code after line 12 of `score` ``."""
    import re

    match = re.fullmatch(r"torch_dynamo_resume_in_(.+)_at_(\d+)", name)
    if match:
        return f"the code after line {match.group(2)} of `{match.group(1)}`"
    return f"`{name}`" + (f" (line {line})" if line else "")
