"""The runtime driver of installed multi-graph artifacts, authored as code, emitted as text.

A graph break inside a function the entry calls (a child module's ``forward``, a helper in
another module) makes Dynamo compile that function as its own frame, entered by an
ordinary call that a standalone dispatcher never sees. Serving those frames takes
Dynamo's own frame evaluator: this installs the captured package's variants onto the
live code objects (as a warm ``torch.compile`` cache load does) and calls the entry
through a Dynamo context whose callback -- bound to this one callable, so other code in
the process keeps compiling -- refuses to compile: a call no variant covers raises
PrecompileError, a frame the capture ran eagerly runs eagerly.
``load(..., allow_serve_time_compiles=True)`` keeps the compiling callback instead, and
the compile is recorded nowhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from collections.abc import Callable

    BACKEND: str = ""
    FN_NAME: str = ""
    FN_MODULE: str = ""
    EAGER_FRAMES: list[tuple[str, int]] = []
    _PACKAGE: str = ""
    #: sha256 of each guarded code's guards state -> the values its guards read at capture.
    _GUARD_VALUES: str = ""
    DYNAMO_GLOBALS: list[list[str]] = []
    _BACKEND_FNS: dict[str, Any] = {}

    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    def check_versions() -> None: ...

    def check_function_sources() -> None: ...

    def import_user_module(name: str) -> Any: ...

    def dynamo_installed_runtime() -> Any: ...

    def serve_as_captured(entry: Any, check: Any, installed: bool = False) -> Any: ...

    def build_dependency_check(before: Callable[[], None] | None = None) -> Any: ...

    def variant_coverage(managers: list[Any], f_locals: dict[str, Any]) -> dict[str, Any]: ...

    def rebuild_global(kind: str, data: str) -> Any: ...


def _build_installed_forward() -> Any:
    """Install the package onto the live code objects; return the served entry."""
    import base64
    import inspect
    import operator
    import pickle

    check_versions()
    check_function_sources()
    rt = dynamo_installed_runtime()
    module = import_user_module(FN_MODULE)
    try:
        fn = operator.attrgetter(FN_NAME)(module)
    except AttributeError:
        refuse(f"precompile: {FN_MODULE} has no {FN_NAME} to install this artifact onto")
    if rt.config.compiled_autograd:
        refuse(
            "precompile: an installed artifact cannot load with "
            "torch._dynamo.config.compiled_autograd enabled: backward graphs would compile "
            "outside the artifact. Disable it before load()"
        )
    state = pickle.loads(base64.b64decode(_PACKAGE))
    try:
        package = rt.package_for(fn, state)
    except Exception as error:
        refuse(
            f"precompile: this artifact could not be installed onto {FN_MODULE}.{FN_NAME} "
            f"({type(error).__name__}: {error}). If that source changed since capture, "
            f"capture it again"
        )
    targets = rt.target_codes(package)
    live = [code.co_name for code in targets if rt.live_entries(code)]
    if live:
        refuse(
            f"precompile: {', '.join(live)} already hold live Dynamo compiles in this process "
            f"(a torch.compile of them, or a capture of them still open), which "
            f"would serve calls the artifact does not: load it in a fresh process"
        )
    taken = [code.co_name for code in targets if rt.precompile_entries(code)]
    if taken:
        refuse(
            f"precompile: {', '.join(taken)} already serve(s) another installed artifact in this "
            f"process; two installed artifacts cannot share a function. Unload the other "
            f"(runnable.unload()) or load this one in a fresh process"
        )
    allow = bool(globals().get("_PRECOMPILE_ALLOW_SERVE_TIME_COMPILES"))
    eager = {
        code
        for code in targets
        if (code.co_name, code.co_firstlineno) in {tuple(e) for e in EAGER_FRAMES}
    }
    with rt.config.patch(caching_precompile=False):
        context = rt.optimize(BACKEND, package=None if allow else package)
        if not isinstance(context, rt.OptimizeContext):
            refuse(
                "precompile: an installed artifact serves through Dynamo, which is disabled in "
                "this process (TORCHDYNAMO_DISABLE=1 or the enable_dynamo killswitch)"
            )
        if not allow:
            # Bound before context(fn), which captures the callback when it wraps.
            context.callback = rt.refusing_callback(context.callback, eager)
        compiled = context(fn)
    rt.install(
        package,
        {backend_id: rt.Backend(f) for backend_id, f in _BACKEND_FNS.items()},
        pickle.loads(base64.b64decode(_GUARD_VALUES)),
    )
    helpers: list[tuple[dict[str, Any], str]] = []
    for module_name, name, kind, data in DYNAMO_GLOBALS:
        scope = vars(import_user_module(module_name))
        scope[name] = rebuild_global(kind, data)
        helpers.append((scope, name))

    def entry(*args: Any, **kwargs: Any) -> Any:
        try:
            return compiled(*args, **kwargs)
        except rt.CompileRefused as error:
            try:
                refuse(
                    f"precompile: no captured variant serves this call: {error}. The artifact "
                    f"serves only what capture exercised: add a call like this one to the "
                    f"capture, or load with allow_serve_time_compiles=True",
                    3,
                )
            except RuntimeError as refusal:
                # Dynamo refuses a frame as it is entered, which may be a frame the entry
                # calls after its own graph ran: load(..., fallback=) must not run the
                # call again (counted as ran-before-refusal; see docs/serving.md).
                refusal.ran_before_refusal = True  # type: ignore[attr-defined]
                raise

    def unload() -> None:
        rt.uninstall(package, targets)
        for scope, name in helpers:
            scope.pop(name, None)

    try:
        check = build_dependency_check()
    except BaseException:
        unload()  # a refused load leaves the process as it found it
        raise
    forward = serve_as_captured(entry, check, installed=True)
    signature = inspect.signature(fn)

    def covers(*args: Any, **kwargs: Any) -> dict[str, Any]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        managers = [p.guard_manager for p in rt.precompile_entries(fn.__code__)]
        return variant_coverage(managers, dict(bound.arguments))

    forward.covers = covers
    forward.unload = unload
    forward.installed = True
    return forward
