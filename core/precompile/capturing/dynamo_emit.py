"""Emit a multi-graph (Dynamo) artifact: frames as pickled records, subgraphs as source.

Dynamo mints names from per-process counters and uuids. The emitter renames backend ids
and resume names to ``<kind>_<k>_<tag>``, where ``tag`` hashes the artifact's content: an
unchanged capture emits byte-identical files, and no live compile or other artifact can
mint a name this one binds into a module. (The builtins-dict key inside the pickled guard
state keeps Dynamo's counter, which is deterministic in a fresh capture process.)
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import pickle
import re
import sys
import types
from typing import Any

import torch

from precompile._compat import dynamo, guard_translation
from precompile._compat.prelude import (
    ARTIFACT_PRELUDE,
    PLAIN_GUARDS_PRELUDE,
)
from precompile.artifact.metadata import ARTIFACT_FORMAT, ARTIFACT_FORMAT_VERSION, render_metadata
from precompile.artifact.schema import MultiGraphDependencies, MultiGraphMetadata
from precompile.capturing import carried
from precompile.capturing.dynamo_capture import DynamoCapture
from precompile.capturing.dynamo_frames import FrameRecord, function_sources, guards_summary
from precompile.capturing.emit import Artifact, artifact_header, runtime_source, source_records
from precompile.errors import PrecompileError
from precompile.runtime import state_checks

_RESUME = re.compile(r"^(__resume_at_\d+)_\d+$")


def _rename_code(serialized: Any, names: dict[str, str]) -> Any:
    """A SerializedCode (and the code objects nested in its constants) with global names
    renamed."""
    consts = tuple(
        _rename_code(c, names) if type(c).__name__ == "SerializedCode" else c
        for c in serialized.co_consts
    )
    return dataclasses.replace(
        serialized,
        co_names=tuple(names.get(n, n) for n in serialized.co_names),
        co_consts=consts,
    )


def _builtins_key(key: str, tag: str) -> str:
    """Dynamo's builtins-dict key (``__builtins_dict___<n>``) renamed to one Dynamo never
    mints, of the same length: the pickled guard state is rewritten in place, and a
    same-length substitution keeps the pickle's framing intact."""
    stem = "__builtins_dict_P"
    return (stem + tag)[: len(key)].ljust(len(key), "0")


def _same_length_name(old: str, tag: str, index: int) -> str:
    """A global Dynamo minted from an object id and compile counter
    (``___module_collections_140466863194576_c0``) renamed to one of the same length
    whose digits hash the artifact's tag: reproducible, and never minted by Dynamo
    (see _builtins_key for why the length is kept)."""
    match = re.match(r"^(_*[A-Za-z]\w*?_|_)(\d.*)$", old)
    stem, tail = (match.group(1), match.group(2)) if match else (old[:1], old[1:])
    digits = str(int(hashlib.sha256(f"{tag}/{stem}/{index}".encode()).hexdigest(), 16))
    return stem + digits[: len(tail)].ljust(len(tail), "0")


def _code_names(serialized: Any) -> set[str]:
    """Every global name a SerializedCode (and the code nested in its constants) reads."""
    names = set(serialized.co_names)
    for const in serialized.co_consts:
        if type(const).__name__ == "SerializedCode":
            names |= _code_names(const)
    return names


def helper_globals(frames: list[FrameRecord]) -> list[tuple[FrameRecord, str, Any]]:
    """The globals Dynamo bound for a frame that its variants' bytecode or guards read,
    besides the ones the package records (subgraphs, resume functions, import aliases,
    the builtins dict): (frame, name, value), in the order Dynamo bound them."""
    found = []
    handled = {
        name
        for frame in frames
        for name in (*frame.backend_ids, *frame.resume_names, *frame.import_sources)
    }
    for frame in frames:
        used: set[str] = set()
        blobs = b""
        for guards_state, code in frame.variants:
            used |= _code_names(code)
            blobs += guards_state
        for name, value in frame.installed_globals.items():
            if name in handled or name.startswith(
                ("__builtins_dict___", "__compiled_fn_", "__resume_at_")
            ):
                continue
            if name in used or re.search(re.escape(name.encode()) + rb"(?!\d)", blobs):
                found.append((frame, name, value))
    return found


def global_recipe(name: str, value: Any, frame: str) -> list[str]:
    """How a serving process rebuilds a global Dynamo bound for a frame's bytecode or
    guards (``[kind, data]``): a module by name, a module's globals dict, a function or
    class by module and qualified name, or a small container of such values by pickled
    value. Anything else is refused: an artifact must not depend on a global it cannot
    recreate."""
    import base64
    import pickle

    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if isinstance(value, dict):
        module = sys.modules.get(str(value.get("__name__", "")))
        if module is not None and vars(module) is value:
            return ["module_dict", module.__name__]
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        module_name = getattr(value, "__module__", None)
        qualname = getattr(value, "__qualname__", "")
        owner: Any = sys.modules.get(module_name or "")
        for part in qualname.split("."):
            owner = getattr(owner, part, None)
        if owner is value:
            return ["object", f"{module_name}:{qualname}"]
    elif isinstance(value, (dict, list, tuple)):
        try:
            blob = pickle.dumps(value, protocol=4)
            same = pickle.loads(blob) == value
        except Exception:
            same = False
        if same:
            return ["value", base64.b64encode(blob).decode("ascii")]
    from precompile.runtime.guard_text import frame_label

    raise PrecompileError(
        f"Dynamo bound a helper global ({type(value).__qualname__}) into the module of "
        f"{frame_label(frame)} that its compiled code reads, and an artifact cannot "
        f"recreate it in another process",
        hint="report the model; as a workaround, move the construct that needs it "
        "(see the capture report's graph breaks) out of the captured function",
        details=f"global {name!r} = {value!r}"[:2000],
    )


def _guard_visible(old: str) -> bool:
    """Names that appear inside pickled guard state (renamed there in place)."""
    return old.startswith("__builtins_dict___") or not old.startswith(
        ("__compiled_fn_", "__resume_at_", "__import_")
    )


def _rekey_guards_state(guards_state: bytes, names: dict[str, str]) -> bytes:
    for old, new in names.items():
        if _guard_visible(old) and len(old) == len(new):
            guards_state = re.sub(re.escape(old.encode()) + rb"(?!\d)", new.encode(), guards_state)
    return guards_state


def _name_map(frames: list[FrameRecord], tag: str) -> dict[str, str]:
    names: dict[str, str] = {}
    for frame in frames:
        for guards_state, _code in frame.variants:
            key = dynamo.builtins_key_of(guards_state)
            if key:
                names[key] = _builtins_key(key, tag)
    for index, (_frame, name, _value) in enumerate(helper_globals(frames)):
        names.setdefault(name, _same_length_name(name, tag, index))
    backends = 0
    for frame in frames:
        for backend_id in frame.backend_ids:
            if backend_id not in names:
                names[backend_id] = f"__compiled_fn_{backends}_{tag}"
                backends += 1
    resume = 0
    for frame in frames:
        for name in frame.resume_names:
            match = _RESUME.match(name)
            prefix = match.group(1) if match else "__resume"
            if name not in names:
                names[name] = f"{prefix}_{resume}_{tag}"
                resume += 1
    return names


def _capture_scope(frame: FrameRecord) -> dict[str, Any]:
    """A copy of the frame's module globals as a load binds them: with what Dynamo bound
    there and the modules its bytecode imports by alias."""
    import importlib

    scope = {**vars(importlib.import_module(frame.python_module)), **frame.installed_globals}
    for alias, module_name in frame.import_sources.items():
        scope.setdefault(alias, importlib.import_module(module_name))
    return scope


def _frame_payload(frames: list[FrameRecord], tag: str) -> list[dict[str, Any]]:
    names = _name_map(frames, tag)
    payload = []
    for frame in frames:
        variants = []
        notes = frame.layout_notes or [[] for _ in frame.variants]
        scope = _capture_scope(frame) if frame.variants else {}
        for number, ((guards_state, dynamo_code), layout_notes) in enumerate(
            zip(frame.variants, notes)
        ):
            # What each guard expects, as the capture read it: a load rebuilding the
            # guards through Dynamo compares against these, not what it reads itself.
            captured = dynamo.captured_guard_values(guards_state, frame.code, scope)
            # The guard state stays as Dynamo's own pickler wrote it, but for its
            # builtins-dict key, renamed in place (see _builtins_key).
            variants.append(
                {
                    "guards_state": _rekey_guards_state(guards_state, names),
                    "dynamo_code": _rename_code(dynamo_code, names),
                    "dict_keys": _variant_dict_keys(frame, number, names),
                    "layout_notes": [list(note) for note in layout_notes],
                    "captured_values": pickle.loads(
                        _rekey_guards_state(pickle.dumps(captured, protocol=4), names)
                    ),
                }
            )
        payload.append(
            {
                "python_module": frame.python_module,
                "import_sources": dict(sorted(frame.import_sources.items())),
                "is_entry": frame.is_entry,
                "code": dynamo.serialize_code(frame.code),
                "resume_names": [names[n] for n in frame.resume_names],
                "variants": variants,
                "bypassed": frame.bypassed,
                "eager_fallback": frame.eager_fallback,
                "eager_reason": frame.eager_reason,
                "trivial": frame.trivial,
            }
        )
    return payload


def _variant_dict_keys(
    frame: FrameRecord, number: int, names: dict[str, str]
) -> list[dict[str, Any]]:
    """The dicts variant ``number``'s guards name keys of by position
    (``_compat.dict_keys``), with the guard state's renames applied."""
    records = frame.dict_keys[number] if number < len(frame.dict_keys) else []
    return list(pickle.loads(_rekey_guards_state(pickle.dumps(records, protocol=4), names)))


def _plain_payload(
    frames: list[FrameRecord], payload: list[dict[str, Any]], names: dict[str, str], tag: str
) -> list[dict[str, Any]]:
    """``payload`` with every variant's guards as a Dynamo-free program and every code
    object as plain fields, so that loading it never imports ``torch._dynamo``; or
    ``UnsupportedGuards`` naming the first guard outside the whitelist. Each program is
    made from Dynamo's own builder in a copy of the frame's module globals holding what
    Dynamo bound there, then renamed like the guard state (same-length names, in place).
    The bytecode's alias of ``torch._dynamo.utils`` is renamed to a tagged one bound to
    the stand-in: a live compile in the module binds the real alias to the real module."""

    stand_in_alias = f"__precompile_dynamo_utils_{tag}"

    plain = []
    for frame, record in zip(frames, payload):
        scope = _capture_scope(frame)
        codes = [frame.code] + [guard_translation.code_of(c) for _state, c in frame.variants]
        sources: dict[str, str] = {}
        aliases: dict[str, str] = {}
        for alias, module_name in record["import_sources"].items():
            source = guard_translation.import_source(alias, module_name, codes)
            if source == guard_translation.DYNAMO_UTILS_STAND_IN:
                aliases[alias] = stand_in_alias
            sources[aliases.get(alias, alias)] = source
        variants = []
        for (guards_state, _code), variant in zip(frame.variants, record["variants"]):
            key = dynamo.builtins_key_of(guards_state)
            if key and key not in scope:
                scope[key] = guard_translation.builtins_of(scope)
            try:
                program = guard_translation.plain_guard_program(
                    guards_state, frame.code, scope, variant["dict_keys"]
                )
            except guard_translation.UnsupportedGuards as error:
                raise guard_translation.UnsupportedGuards(f"{frame.name}: {error}") from error
            except Exception as error:
                raise guard_translation.UnsupportedGuards(
                    f"{frame.name}: its guards could not be rebuilt at capture "
                    f"({type(error).__name__}: {error})"
                ) from error
            blob = pickle.dumps(program, protocol=4)
            if any(alias.encode() in blob for alias in aliases):
                raise guard_translation.UnsupportedGuards(
                    f"{frame.name}: a guard reads {guard_translation.DYNAMO_UTILS}"
                )
            variants.append(
                {
                    "guards": pickle.loads(_rekey_guards_state(blob, names)),
                    "builtins_key": names.get(key, key) if key else None,
                    "dict_keys": variant["dict_keys"],
                    "layout_notes": variant["layout_notes"],
                    "dynamo_code": guard_translation.plain_code(
                        _rename_code(variant["dynamo_code"], aliases)
                    ),
                }
            )
        plain.append(
            record
            | {
                "code": guard_translation.plain_code(record["code"]),
                "variants": variants,
                "import_sources": sources,
            }
        )
    return plain


def guard_runtime(
    frames: list[FrameRecord], payload: list[dict[str, Any]], tag: str, serving_mode: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Which guards an artifact serves with -- ``plain`` (``runtime.multigraph_guards``, no Dynamo at
    load) when every guard of every variant translates, else ``dynamo`` with the reason --
    and the frame payload for that path."""
    if serving_mode == "installed":
        reason = "installed serving runs Dynamo's frame evaluation"
        return {"path": "dynamo", "reason": reason}, payload
    try:
        plain = _plain_payload(frames, payload, _name_map(frames, tag), tag)
    except guard_translation.UnsupportedGuards as error:
        return {"path": "dynamo", "reason": str(error)}, payload
    return {"path": "plain", "reason": None}, plain


def content_tag(
    frames: list[FrameRecord], graph_sources: list[str], fn_info: dict[str, Any]
) -> str:
    """A hash of what the artifact serves, stable across capture processes: the function,
    the subgraphs' source, each variant's bytecode (with placeholder names) and the guards
    it kept. Dynamo's pickled guard state is left out: it embeds process-specific ids in
    its debug text."""
    digest = hashlib.sha256(f"{fn_info['module']}.{fn_info['name']}".encode())
    for source in sorted(graph_sources):
        digest.update(source.encode())
    names = _name_map(frames, "TAG")
    for frame in frames:
        digest.update(frame.name.encode())
        for _state, code in frame.variants:
            try:
                digest.update(pickle.dumps(_rename_code(code, names), protocol=4))
            except (TypeError, AttributeError, pickle.PicklingError) as error:
                raise PrecompileError(
                    f"the code Dynamo compiled for {frame.name} holds a value that cannot "
                    f"be saved into an artifact ({error}): Dynamo put a live object among "
                    f"its constants, as it does where fn walks its module's globals() "
                    f"(their items, their length)",
                    hint="read the globals fn needs by name (globals()['K'] is one), or pass "
                    "them as arguments",
                ) from error
        for decisions in frame.guards:
            digest.update(
                repr([(d.name, d.guard_type, d.kept, d.value) for d in decisions]).encode()
            )
    return digest.hexdigest()[:12]


def _package_payload(package: Any, frames: list[FrameRecord], tag: str) -> Any:
    """The package's cache entry (what CompilePackage.install takes) with Dynamo's minted
    names renamed like the standalone payload's."""
    names = _name_map(frames, tag)
    entry = package.cache_entry()
    codes = [
        dataclasses.replace(
            code,
            function_names=[names.get(n, n) for n in code.function_names],
            backend_ids=[names.get(b, b) for b in code.backend_ids],
            guarded_codes=[
                dataclasses.replace(
                    g,
                    guards_state=_rekey_guards_state(g.guards_state, names),
                    dynamo_code=_rename_code(g.dynamo_code, names),
                )
                for g in code.guarded_codes
            ],
        )
        for code in entry.codes
    ]
    return dataclasses.replace(entry, codes=codes)


def _renamed_dependencies(
    dependencies: dict[str, Any] | None, names: dict[str, str]
) -> MultiGraphDependencies:
    """MODULE_HOOKS and GLOBAL_READS with the access paths through globals Dynamo minted
    (a namedtuple's globals dict, the builtins dict) renamed like the bytecode."""
    dependencies = dependencies or {"MODULE_HOOKS": {"roots": [], "global": {}}, "GLOBAL_READS": []}
    minted = {old: new for old, new in names.items() if _guard_visible(old)}

    def rename(path: str) -> str:
        for old, new in minted.items():
            if old in path:
                path = re.sub(re.escape(old) + r"(?!\d)", new, path)
        return path

    hooks = dependencies["MODULE_HOOKS"]
    return {
        "MODULE_HOOKS": {
            **hooks,
            "roots": [{**root, "path": rename(root["path"])} for root in hooks["roots"]],
        },
        "GLOBAL_READS": [
            {**read, "path": rename(read["path"])} for read in dependencies["GLOBAL_READS"]
        ],
        "ARG_IDENTITIES": dependencies.get("ARG_IDENTITIES", []),
        "ARG_RELATIONS": dependencies.get("ARG_RELATIONS", []),
        "FLOAT_ZEROS": dependencies.get("FLOAT_ZEROS", []),
        "ORDERED_DICTS": dependencies.get("ORDERED_DICTS", []),
        "CLASS_ATTRS": dependencies.get("CLASS_ATTRS", []),
        "BUILTIN_READS": dependencies.get("BUILTIN_READS", []),
        "TRACED_FUNCS": dependencies.get("TRACED_FUNCS", []),
        "LIBRARY_SURFACE": dependencies.get("LIBRARY_SURFACE", []),
        "GRAD_MODE_READ": dependencies.get("GRAD_MODE_READ", ""),
        "GRAD_FLAGS": dependencies.get("GRAD_FLAGS", {"params": None, "read": ""}),
        "PROCESS_STATE": dependencies.get("PROCESS_STATE", []),
    }


def _encode(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value, protocol=4)).decode("ascii")


def _tensor_guards(
    frames: list[FrameRecord], payload: list[dict[str, Any]]
) -> dict[str, list[list[dict[str, Any]]]]:
    """Backend id -> the TENSOR_MATCH specs of each variant of every frame that calls
    it, in the plain guard programs the artifact serves with (what an Inductor subgraph's
    skipped input asserts are proven by: ``inductor_backend.dynamo_proven_inputs``)."""
    from precompile.capturing.inductor_backend import tensor_match_specs

    found: dict[str, list[list[dict[str, Any]]]] = {}
    for frame, record in zip(frames, payload):
        specs = [tensor_match_specs(variant["guards"]) for variant in record["variants"]]
        for backend_id in frame.backend_ids:
            found.setdefault(backend_id, []).extend(specs)
    return found


def emit_dynamo(
    capture: DynamoCapture,
    *,
    fn_info: dict[str, Any],
    artifact_path: str,
    input_sources: list[dict[str, Any]],
) -> Artifact:
    """The artifact of a finished capture. Its graphs section is rendered by
    ``capture.graphs.section(names)`` under the names normalized from the content tag.
    An ``installed`` artifact carries the renamed package (``_PACKAGE``) instead of frame
    records, and installs it at load."""
    fn, frames, backend = capture.fn, capture.frames, capture.backend
    serving_mode, package = capture.serving_mode, capture.package
    binding = {"defaults": fn.__defaults__, "kwdefaults": fn.__kwdefaults__}
    try:
        encoded_binding = _encode(binding)
    except Exception as error:
        raise PrecompileError(
            f"{fn.__qualname__}'s default arguments cannot be pickled into the artifact ({error})",
            hint="use defaults that are plain Python values",
        ) from error
    tag = content_tag(frames, capture.graphs.sources, fn_info)
    frame_payload = _frame_payload(frames, tag)
    guard_path, payload = guard_runtime(frames, frame_payload, tag, serving_mode)
    plain = guard_path["path"] == "plain"
    names = _name_map(frames, tag)
    helpers = [
        [frame.python_module, names[name], *global_recipe(name, value, frame.name)]
        for frame, name, value in helper_globals(frames)
    ]
    metadata: MultiGraphMetadata = {
        "FORMAT": ARTIFACT_FORMAT,
        "FORMAT_VERSION": ARTIFACT_FORMAT_VERSION,
        "BACKEND": backend,
        "TRACER": "dynamo",
        "SERVING_MODE": serving_mode,
        "FN_NAME": fn_info["name"],
        "FN_MODULE": fn_info["module"],
        "ARTIFACT_TAG": tag,
        "GRAD_MODE": capture.training,
        "GLOBAL_STATE": capture.global_state,
        "AMBIENT_MODES": list(capture.ambient_modes),
        # The eager backend runs each graph's torch calls as eager does: a dispatch
        # mode around a call sees its ATen operations (driver.check_ambient_modes).
        # (Installed serving leaves guards to Dynamo, which reads a dispatch mode as
        # another dispatch key set.)
        "MODES_SEE_OPS": backend == "eager" and serving_mode != "installed",
        "FRAMES": [
            f.summary() | {"resume_names": p["resume_names"]} for f, p in zip(frames, payload)
        ],
        "GUARDS": guards_summary(frames),
        "GUARD_RUNTIME": guard_path,
        "DYNAMO_GLOBALS": helpers,
        **_renamed_dependencies(capture.dependencies, names),
        "FUNCTION_SOURCES": function_sources(fn, frames, artifact_path, capture.codes),
        "INPUT_SOURCES": input_sources,
        "TORCH_VERSION": str(torch.__version__),
        "PYTHON_VERSION": list(sys.version_info[:2]),
        "SOURCES": source_records(capture.source_files, artifact_path),
    }
    if serving_mode == "installed":
        metadata["EAGER_FRAMES"] = [
            [f.name, f.code.co_firstlineno] for f in frames if f.eager_fallback
        ]
        payloads = {
            "_PACKAGE": _encode(_package_payload(package, frames, tag)),
            # What each guarded code's guards read at capture, by its guards state
            # (renamed as in the package): the install rebuilds them with these.
            "_GUARD_VALUES": _encode(
                {
                    hashlib.sha256(variant["guards_state"]).hexdigest(): variant["captured_values"]
                    for record in frame_payload
                    for variant in record["variants"]
                }
            ),
        }
    else:
        payloads = {"_FRAMES": _encode(payload), "_ENTRY_BINDING": encoded_binding}
    # An ambient autocast is named by state_checks' one list of its devices.
    driver_source = f"AUTOCAST_DEVICES = {state_checks.AUTOCAST_DEVICES!r}\n\n" + runtime_source(
        carried.MultiGraph.driver(plain_guards=plain, installed=serving_mode == "installed")
    )
    build = (
        "_build_installed_forward" if serving_mode == "installed" else "_build_multigraph_forward"
    )
    text = "\n".join(
        [
            artifact_header(fn_info, "dynamo", backend),
            "# ---- metadata: literals only; precompile.inspect_artifact reads them unexecuted",
            render_metadata(metadata),
            # After the metadata, which every load parses (ast): a ResNet's frame payload
            # is a megabyte of base64 that only the driver reads.
            "# ---- serialized frames (base64 pickles), read by the runtime driver",
            *(f"{name} = {value!r}" for name, value in payloads.items()),
            "",
            "# ---- imports",
            ARTIFACT_PRELUDE,
            *((PLAIN_GUARDS_PRELUDE,) if plain else ()),
            "import base64",
            "import functools",
            "",
            # The Inductor modules and the guard checks compile through it (cached).
            runtime_source(carried.MultiGraph.BYTECODE),
            "",
            "",
            capture.graphs.section(names, _tensor_guards(frames, payload) if plain else None),
            "",
            "# ---- runtime driver (emitted verbatim: precompile.capturing.carried.MultiGraph.driver)",
            driver_source,
            "",
            f"forward = {build}()",
            "covers = forward.covers",
            "_unload = forward.unload",
            "",
        ]
    )
    return Artifact(python_code=text.encode("utf-8"), metadata=metadata)
