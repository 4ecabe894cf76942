"""The artifact's compiled bytecode, kept in its cache so that a load skips ``compile()``.

Compiling an artifact's source is most of what loading one costs (tens of milliseconds
for the runtime driver it carries). The capture compiles it once and stores the marshalled
code object in the cache bundle, tagged with the interpreter's bytecode magic number. The
bundle is bound to the source by the envelope's ``code_hash`` and every blob in it to its
digest (and, when signed, both files to the signature), so the bytecode is exactly as
trusted as the kernels beside it: both files are code. Another interpreter, a cache
without bytecode, or no cache at all compiles the source as before, with identical
behaviour.

The same holds for the text an artifact compiles while it loads (each inlined Inductor
output module, each variant's straight-line guard check): ``compiled_source``, emitted
into artifacts, takes the code object from the bundle's ``compiled_sources`` when one
was cached for exactly that text, and else compiles it (and records it, so the capture,
which runs the artifact once, can cache it: ``sources_entry``).
"""

from __future__ import annotations

import importlib.util
import marshal
import types
from typing import Any

#: The bundle key holding ``{"tag": ..., "code": bytes}``.
BUNDLE_KEY = "python_bytecode"
#: The filename compiled into the cached bytecode: a pair emitted into two folders has
#: identical bytes; a load names the file it loaded (``_renamed``).
PLACEHOLDER = "<torch-precompile artifact>"
#: The bundle key holding ``{"tag": ..., "codes": {key: marshalled code}}``, keyed by
#: ``compiled_source``'s digest of the text it compiles (the literal inside it).
SOURCES_KEY = "compiled_sources"
#: The artifact namespace entry in which ``compiled_source`` records what it compiled.
COMPILED_SOURCES = "_PRECOMPILE_COMPILED_SOURCES"


def _tag() -> str:
    """Bytecode from one interpreter is meaningless to another: the magic number changes
    with every bytecode format."""
    return importlib.util.MAGIC_NUMBER.hex()


def compile_source(python_code: bytes, origin: str) -> types.CodeType:
    """Compiled at optimization level 0 whatever ``-O`` the process runs with: the cached
    bytecode and a fresh compile behave alike."""
    return compile(python_code, origin, "exec", dont_inherit=True, optimize=0)


def bytecode_entry(python_code: bytes) -> dict[str, Any]:
    """What the capture stores under ``BUNDLE_KEY``."""
    return {"tag": _tag(), "code": marshal.dumps(compile_source(python_code, PLACEHOLDER))}


def artifact_code(python_code: bytes, origin: str, bundle: dict[str, Any] | None) -> types.CodeType:
    """The code object to execute: the cached bytecode when it was made by this
    interpreter, else ``python_code`` compiled now; either way named ``origin``."""
    entry = (bundle or {}).get(BUNDLE_KEY)
    if isinstance(entry, dict) and entry.get("tag") == _tag():
        try:
            code = marshal.loads(entry["code"])
        except (EOFError, ValueError, TypeError, KeyError):
            code = None
        if isinstance(code, types.CodeType):
            return _renamed(code, origin)
    return compile_source(python_code, origin)


def _renamed(code: types.CodeType, origin: str) -> types.CodeType:
    """``code`` with every nested code object's filename set to ``origin``: tracebacks
    and source checks name the file that was loaded, wherever the pair was moved."""
    consts = tuple(
        _renamed(c, origin) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    return code.replace(co_filename=origin, co_consts=consts)


def compiled_source(source: str, filename: str, mode: str = "exec") -> types.CodeType:
    """Emitted into artifacts: ``source`` compiled, as ``compile(source, filename, mode)``
    at optimization level 0 with no inherited future flags (so cached and fresh code
    behave alike). The code object comes from the verified cache bundle
    (``_PRECOMPILE_BUNDLE``, in the artifact's globals) when it holds one made by this
    interpreter for exactly this text (keyed by the digest of mode, filename and text),
    and is compiled otherwise; anything unreadable there is compiled too, never run.
    What it compiles it records in ``_PRECOMPILE_COMPILED_SOURCES`` when the namespace
    has one (the capture's run of the artifact), for ``sources_entry`` to cache."""
    import hashlib
    import importlib.util
    import marshal
    import types

    scope = globals()
    text = f"{mode}\0{filename}\0{source}".encode("utf-8", "surrogatepass")
    key = hashlib.sha256(text).hexdigest()
    entry = (scope.get("_PRECOMPILE_BUNDLE") or {}).get("compiled_sources")
    if isinstance(entry, dict) and entry.get("tag") == importlib.util.MAGIC_NUMBER.hex():
        data = (entry.get("codes") or {}).get(key)
        if isinstance(data, bytes):
            try:
                code = marshal.loads(data)
            except (EOFError, ValueError, TypeError):
                code = None
            if isinstance(code, types.CodeType) and code.co_filename == filename:
                return code
    code = compile(source, filename, mode, dont_inherit=True, optimize=0)
    compiled = scope.get("_PRECOMPILE_COMPILED_SOURCES")
    if isinstance(compiled, dict):
        compiled[key] = code
    return code


def sources_entry(namespace: dict[str, Any]) -> dict[str, Any]:
    """What the capture stores under ``SOURCES_KEY``: every code object the artifact
    compiled from text while the capture ran it, marshalled."""
    compiled = namespace.get(COMPILED_SOURCES) or {}
    return {"tag": _tag(), "codes": {key: marshal.dumps(code) for key, code in compiled.items()}}
