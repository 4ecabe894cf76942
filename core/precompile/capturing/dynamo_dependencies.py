"""What a Dynamo trace depended on that its serialized guards cannot check, recorded at
capture so an artifact can check it when serving.

Dynamo's own guards on these are identity checks (dropped: an identity does not survive
a process) or skipped altogether (``skip_nnmodule_hook_guards``). ``DependencyRecorder``
is fed every guard entry Dynamo offers the guard filter and composes one recorder per
kind of dependency, each beside the runtime check that reads its record:

- **Module hooks** (``HookRecorder``, here; ``runtime.multigraph_dependencies``). The
  forward, forward-pre, backward and backward-pre hooks of every module the trace
  reached (found from the guards on module-valued access paths, walked to every
  submodule) and torch's global module hooks: a hook added or removed after capture
  changes the answer, so the artifact records which hooks were there -- each by what it
  is, as make_fx records them (``value_fingerprints.hooks_fingerprint``: code, closure,
  defaults, registration flags), with its ``module.qualname`` for messages -- and
  refuses a call that meets others.
- **The names the frames resolved**: module globals, classes, builtins
  (``dynamo_name_records``; ``runtime.multigraph_name_checks``).
- **What fn's arguments reach** (``runtime.multigraph_argument_checks``): objects compared
  by identity and which paths held one object (``dynamo_identity_records``), signed zeros
  and OrderedDict orders (``dynamo_value_records``), a later frame's locals mapped to
  paths from the arguments (``dynamo_argument_paths``).
- **Grad mode read by the user's code** (``torch.is_grad_enabled()``, or
  ``.requires_grad`` / ``.grad_fn`` / ``.is_leaf`` of a tensor the trace computed, which
  Dynamo bakes from the capture's grad mode, in fn or any non-torch code it ran), here:
  the driver serves under the captured grad mode, so a call made in another grad mode is
  refused instead of being answered as the captured mode would (``GRAD_MODE_READ`` says
  what was read). torch's own reads (a fast-path test) pick how to compute, not what:
  they are evaluated against the grad mode the graphs run under, as make_fx's are.

The checks themselves are ``precompile.runtime.multigraph_dependencies`` and its
sub-builders, emitted into artifacts.

Messages name things in the user's words (``precompile.runtime.guard_text``).
"""

from __future__ import annotations

import inspect
import re
import types
from typing import Any

import torch

from precompile.capturing.dynamo_argument_paths import ACCESS_ROOT, ArgumentPaths
from precompile.capturing.dynamo_identity_records import IdentityRecorder
from precompile.capturing.dynamo_name_records import NameRecorder, builtin_reads
from precompile.capturing.dynamo_value_records import ValueRecorder
from precompile.errors import PrecompileError
from precompile.runtime.guard_text import user_path
from precompile.runtime.multigraph_dependencies import global_hook_snapshot, hook_snapshot


class HookRecorder:
    """The hooks of every module the trace reached, and torch's global module hooks
    (``MODULE_HOOKS``)."""

    def __init__(
        self, signature: inspect.Signature, global_modules: dict[str, torch.nn.Module]
    ) -> None:
        self.signature = signature
        #: Modules the trace read from module globals, by how fn names them (shared with
        #: ``ArgumentPaths``, which checks a later frame's module has no twin there).
        self.global_modules = global_modules
        #: (root kind, module or parameter, access path) -> hook snapshot.
        self.roots: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
        self.global_hooks: dict[str, Any] | None = None
        self.conflicts: list[str] = []
        #: Root key -> {dotted path of a submodule whose class defines its own
        #: ``__getattr__``: the names its instance ``__dict__`` held at every trace}.
        self.open_keys: dict[tuple[str, str, str], dict[str, set[str]]] = {}
        #: Root key -> the module objects found there (one per captured call that
        #: passed a new one): where a relaxed flag's module is found by identity.
        self.root_modules: dict[tuple[str, str, str], list[torch.nn.Module]] = {}
        #: (module, name, whether every read found it) of each training-only flag whose
        #: Dynamo guards were relaxed (``_compat.dynamo_guard_relaxing.
        #: relaxing_neutral_guards`` appends them): recorded per root as ``"flags"``
        #: (dotted submodule path -> [[name, always held]]), for the per-call module check
        #: to check by the kind of its truth test, and that a flag held is still there.
        self.relaxed_flags: list[tuple[torch.nn.Module, str, bool]] = []
        #: Whether the artifact is an inference one (set by the session): its hook
        #: snapshots leave out forward hooks that only mark their output as requiring
        #: grad (``hook_snapshot``).
        self.inference = False

    def observe(
        self, modules: dict[str, torch.nn.Module], is_entry: bool, module_name: str
    ) -> None:
        """The hooks of the modules one frame's guards reached (by access path), and
        torch's global hooks."""
        for name, module in modules.items():
            if any(name.startswith((other + ".", other + "[")) for other in modules):
                continue  # reached from a module already recorded
            match = ACCESS_ROOT.match(name)
            if match is None or (match.group("local") and not is_entry):
                continue  # a continuation's locals: reached from the entry's arguments
            kind = "local" if match.group("local") else "global"
            key = (kind, match.group("local") if kind == "local" else module_name, name)
            if kind == "global":
                self.global_modules[user_path(name)] = module
            self._observe_open_modules(key, module)
            found = self.root_modules.setdefault(key, [])
            if not any(m is module for m in found):
                found.append(module)
            snapshot = hook_snapshot(module, self.inference)
            if self.roots.setdefault(key, snapshot) != snapshot:
                self.conflicts.append(
                    f"the hooks on `{user_path(name)}` changed between captured calls"
                )
        global_snapshot = global_hook_snapshot()
        if self.global_hooks is None:
            self.global_hooks = global_snapshot
        elif self.global_hooks != global_snapshot:
            self.conflicts.append("torch's global module hooks changed between captured calls")

    def _observe_open_modules(self, key: tuple[str, str, str], module: torch.nn.Module) -> None:
        """Record the instance ``__dict__`` names of each submodule whose class defines
        its own ``__getattr__`` (forwarding to an inner module, say): the trace resolved
        some names through it, and Dynamo guards what it returned, not that the name is
        still missing from the instance ``__dict__``. Names held at every trace are safe;
        ``check_shadowing`` refuses any other."""
        found = {
            dotted: set(vars(sub))
            for dotted, sub in module.named_modules()
            if type(sub).__getattr__ is not torch.nn.Module.__getattr__
        }
        known = self.open_keys.setdefault(key, found)
        for dotted, names in found.items():
            known[dotted] = known.get(dotted, names) & names

    def metadata(self) -> dict[str, Any]:
        """``MODULE_HOOKS``, as an artifact literal; refuses hooks that changed between
        captured calls."""
        if self.conflicts:
            raise PrecompileError(
                f"{self.conflicts[0]}; one artifact serves one set of hooks",
                hint="register the hooks before the first captured call and keep them, or "
                "capture each configuration into its own artifact",
            )
        params = list(self.signature.parameters.values())
        roots = []
        for (kind, owner, path), hooks in sorted(self.roots.items()):
            row: dict[str, Any] = {"kind": kind, "path": path, "hooks": hooks}
            open_keys = self.open_keys.get((kind, owner, path))
            if open_keys:
                row["open"] = {dotted: sorted(names) for dotted, names in open_keys.items()}
            flags = self._flags_under(self.root_modules.get((kind, owner, path), []))
            if flags:
                row["flags"] = flags
            if kind == "local":
                param = self.signature.parameters.get(owner)
                if param is None:
                    continue
                row["param"] = owner
                row["index"] = (
                    params.index(param)
                    if param.kind
                    in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                    else None
                )
                row["variadic"] = param.kind in (
                    inspect.Parameter.VAR_POSITIONAL,
                    inspect.Parameter.VAR_KEYWORD,
                )
            else:
                row["module"] = owner
            roots.append(row)
        self._refuse_unreached_flags()
        return {"roots": roots, "global": self.global_hooks or {}, "inference": self.inference}

    def _flags_under(self, modules: list[torch.nn.Module]) -> dict[str, list[list[Any]]]:
        """The relaxed flags held by ``modules``' submodules, as (dotted path -> [[name,
        whether every captured read found it]])."""
        flags: dict[str, dict[str, bool]] = {}
        for module in modules:
            at = {id(sub): dotted for dotted, sub in module.named_modules()}
            for flagged, name, held in self.relaxed_flags:
                if id(flagged) in at:
                    names = flags.setdefault(at[id(flagged)], {})
                    names[name] = names.get(name, True) and held
        return {
            dotted: [[name, held] for name, held in sorted(names.items())]
            for dotted, names in sorted(flags.items())
        }

    def _refuse_unreached_flags(self) -> None:
        """Refuse a relaxed flag on a module no root reaches: no per-call check would see
        its value, whose truth test eager runs."""
        reached = {
            id(sub)
            for modules in self.root_modules.values()
            for module in modules
            for sub in module.modules()
        }
        for flagged, name, _held in self.relaxed_flags:
            if id(flagged) not in reached:
                raise PrecompileError(
                    f"the trace read `{name}` of a {type(flagged).__qualname__} only as "
                    f"`{name} and training`, but that module is not reached from fn's "
                    f"arguments or a module global, so the artifact could not check per "
                    f"call that `{name}`'s truth test (which eager runs first) is pure",
                    hint="pass the module to fn as an argument, or hold it in a global",
                )


class DependencyRecorder:
    """Fed every guard entry Dynamo offers the guard filter, per compiled variant; one
    recorder per kind of dependency."""

    def __init__(self, fn: types.FunctionType) -> None:
        self.fn = fn
        self.signature = inspect.signature(fn)
        #: Why the capture cannot be served (objects compared by identity and
        #: unnameable, ...), appended to by every recorder in the order met.
        self.refusals: list[tuple[str, str]] = []
        self.paths = ArgumentPaths(fn)
        self.hooks = HookRecorder(self.signature, self.paths.global_modules)
        self.names = NameRecorder()
        self.identities = IdentityRecorder(self.paths, self.names, self.refusals)
        self.values = ValueRecorder(self.paths, self.refusals)
        #: What a trace read that depends on the grad mode ('' for nothing): the
        #: ``torch.is_grad_enabled()`` guard, or grad-dependent tensor attributes.
        self.grad_mode_read = ""
        #: The grad-mode reads the user's code made (``torch.is_grad_enabled()``,
        #: grad-dependent attributes), appended while tracing
        #: (``_compat.dynamo_recording.recording_grad_dependent_reads``).
        self.grad_reads: list[str] = []
        #: Those made in torch's own code (nn.MultiheadAttention's fast-path test, say):
        #: evaluated against the grad mode the graphs run under, never a refusal.
        self.library_grad_reads: list[str] = []
        #: The user's reads of ``.requires_grad`` (``.grad_fn``, ``.is_leaf``) of a
        #: tensor fn was passed: they make those flags part of what it computes.
        self.grad_flag_reads: list[str] = []
        #: Per module argument (its position, or its keyword), the names of its
        #: parameters that required grad at capture; None once two captured calls
        #: disagree (``GRAD_FLAGS``).
        self.param_grad_flags: dict[str, list[str]] | None = {}

    @property
    def read_codes(self) -> dict[types.CodeType, None]:
        """The code of every function the frames read from a module global."""
        return self.names.read_codes

    @property
    def classes(self) -> dict[type, None]:
        """The classes of every module the trace reached."""
        return self.names.classes

    def calling(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Before each captured call: remember its arguments by parameter name."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            self.paths.arguments = {}
            return
        bound.apply_defaults()
        self.paths.arguments = dict(bound.arguments)
        flags = {
            str(key): sorted(n for n, p in value.named_parameters() if p.requires_grad)
            for key, value in [*enumerate(args), *kwargs.items()]
            if isinstance(value, torch.nn.Module)
        }
        if self.param_grad_flags is not None:
            seen = self.param_grad_flags
            if any(seen.get(key, names) != names for key, names in flags.items()):
                self.param_grad_flags = None
            else:
                seen.update(flags)
        self.values.check_zero_signs()

    def observe(self, code: types.CodeType | None, module_name: str, entries: list[Any]) -> None:
        """One frame's guard entries (``code``, of module ``module_name``), offered to
        every recorder in turn."""
        is_entry = code is self.fn.__code__
        modules = {
            e.name: e.value
            for e in entries
            if getattr(e, "has_value", False) and isinstance(e.value, torch.nn.Module)
        }
        self.names.observe_modules(modules.values())
        self.hooks.observe(modules, is_entry, module_name)
        self.names.observe(module_name, entries)
        for e in entries:
            if not getattr(e, "has_value", False):
                continue
            if e.value is torch.is_grad_enabled and not self.grad_mode_read:
                self.grad_mode_read = "torch.is_grad_enabled()"
            numpy = re.fullmatch(r"___from_numpy\((.+)\)", e.name)
            if numpy is not None:
                # Dynamo guards a numpy scalar or array as a tensor it made from it, and
                # that guard does not survive serialization: every load would fail.
                self.refusals.append(
                    (
                        f"`{user_path(numpy.group(1))}` is a numpy value, which Dynamo guards "
                        f"in a form an artifact cannot load",
                        "store a Python number (float(...), int(...)) or a torch tensor "
                        "instead of a numpy value",
                    )
                )
        self.identities.observe(code, module_name, is_entry, entries)
        self.values.observe(code, module_name, is_entry, entries)

    def verify(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """After a captured call: every path the artifact evaluates from the arguments
        must still lead to what the capture saw there; refuse one that cannot."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return
        bound.apply_defaults()
        self.verify_ordered_dicts(dict(bound.arguments))
        self.identities.verify(dict(bound.arguments))

    def verify_relations(self, arguments: dict[str, Any]) -> None:
        """``IdentityRecorder.verify_relations``."""
        self.identities.verify_relations(arguments)

    def verify_ordered_dicts(self, arguments: dict[str, Any]) -> None:
        """``ValueRecorder.verify_ordered_dicts``."""
        self.values.verify_ordered_dicts(arguments)

    def class_rows(self, traced: list[types.CodeType]) -> list[dict[str, Any]]:
        """``CLASS_ATTRS`` (``NameRecorder.class_rows``)."""
        return self.names.class_rows(traced)

    def metadata(self, traced: list[types.CodeType] | None = None) -> dict[str, Any]:
        """``MODULE_HOOKS``, ``GLOBAL_READS``, ``ARG_IDENTITIES``, ``GRAD_MODE_READ`` and
        ``CLASS_ATTRS`` (``traced``: the code of every function the trace ran), as
        artifact literals."""
        shared = self.paths.shared_frames()
        through_metaclass = self.names.metaclass_refusal(list(traced or ()))
        if through_metaclass is not None:
            self.refusals.append(through_metaclass)
        if self.refusals or shared:
            message, hint = self.refusals[0] if self.refusals else shared  # type: ignore[misc]  # one of them is set
            raise PrecompileError(message, hint=hint, invariant=1)
        return {
            "MODULE_HOOKS": self.hooks.metadata(),
            "GLOBAL_READS": self.names.rows(),
            **self.identities.rows(),
            **self.values.rows(),
            "CLASS_ATTRS": self.class_rows(list(traced or ())),
            "BUILTIN_READS": builtin_reads([self.fn.__code__, *(traced or ())]),
            # A read in the user's code; the guard alone (no call the trace recorded,
            # so no place to tell torch's reads from the user's) counts as one.
            "GRAD_MODE_READ": self.grad_reads[0]
            if self.grad_reads
            else ("" if self.library_grad_reads else self.grad_mode_read),
            # What serving needs to pass a call whose tensors' requires_grad differ
            # from the capture's to an inference artifact (multigraph_driver).
            "GRAD_FLAGS": {
                "params": self.param_grad_flags,
                "read": self.grad_flag_reads[0] if self.grad_flag_reads else "",
            },
        }
