"""The one bytecode scanner (``capturing.bytecode_names``) both tracers' recorders read
global and builtin names with: its raw decoding names what ``dis`` names, over torch's
module library and code with long jumps (``EXTENDED_ARG``)."""

from __future__ import annotations

import builtins
import dis
import types

import torch

from precompile.capturing import (
    bytecode_names,
    dynamo_name_records,
    fx_dependencies,
    fx_side_effects,
)


def _codes() -> list[types.CodeType]:
    """Every code object of torch.nn's modules and functional, nested code included,
    and one function long enough that its jumps need EXTENDED_ARG."""
    body = "\n".join(f"    if x > {i}:\n        x = len(g{i}) + abs(x)" for i in range(300))
    source = f"def long(x):\n{body}\n    global h\n    h = x\n    del h\n    return sorted(x)\n"
    namespace: dict[str, object] = {}
    exec(compile(source, "<long>", "exec"), namespace)
    pending = [namespace["long"].__code__]  # type: ignore[attr-defined]
    for module in (torch.nn.modules.module, torch.nn.modules.container, torch.nn.functional):
        pending += [v.__code__ for v in vars(module).values() if isinstance(v, types.FunctionType)]
        for cls in vars(module).values():
            if isinstance(cls, type):
                pending += [
                    v.__code__ for v in vars(cls).values() if isinstance(v, types.FunctionType)
                ]
    codes = []
    while pending:
        code = pending.pop()
        codes.append(code)
        pending += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return codes


def _by_dis(code: types.CodeType, ops: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(
        dict.fromkeys(str(i.argval) for i in dis.get_instructions(code) if i.opname in ops)
    )


def test_the_scanner_names_what_dis_names() -> None:
    codes = _codes()
    assert len(codes) > 200
    assert any("EXTENDED_ARG" in {i.opname for i in dis.get_instructions(c)} for c in codes)
    table = vars(builtins)
    for code in codes:
        loads = _by_dis(code, ("LOAD_GLOBAL",))
        assert bytecode_names.global_loads(code) == loads, code
        assert bytecode_names.global_names(code) == _by_dis(
            code, ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL")
        ), code
        builtin = tuple(n for n in loads if n in table and not n.startswith("__"))
        assert bytecode_names.builtin_loads(code) == builtin, code


def test_both_tracers_read_names_through_it() -> None:
    assert fx_dependencies.global_loads is bytecode_names.global_loads
    assert fx_side_effects.global_names is bytecode_names.global_names
    assert fx_dependencies.builtin_loads is bytecode_names.builtin_loads
    assert dynamo_name_records.global_loads is bytecode_names.global_loads
    assert not hasattr(fx_dependencies, "_global_loads")
    assert not hasattr(fx_dependencies, "_builtin_loads")


def test_attribute_chains_name_what_is_read_off_a_name_and_what_an_import_binds() -> None:
    """The chains the standard-library record is built from: rooted at a global, or at
    a name an import in the code itself bound, and the imports themselves."""
    source = (
        "def f(x):\n"
        "    import sys as s\n"
        "    from os import path as p, sep\n"
        "    import os.path\n"
        "    y = s.argv\n"
        "    z = p.sep + os.path.join('a', 'b')\n"
        "    return time.timezone + x.size(0) + g.a.b.c\n"
    )
    namespace: dict[str, object] = {}
    exec(compile(source, "<chains>", "exec"), namespace)
    chains = bytecode_names.attribute_chains(namespace["f"].__code__)  # type: ignore[attr-defined]
    assert ("import", "sys", ()) in chains and ("import", "sys", ("argv",)) in chains
    assert ("import", "os", ("path",)) in chains and ("import", "os", ("sep",)) in chains
    assert ("import", "os.path", ("sep",)) in chains  # p.sep: p is os.path
    assert ("import", "os", ("path", "join")) in chains  # import os.path binds os
    assert ("global", "time", ("timezone",)) in chains
    assert ("global", "g", ("a", "b", "c")) in chains
    # A local that no import bound (x) roots no chain.
    assert not any("size" in attributes for _, _, attributes in chains)
