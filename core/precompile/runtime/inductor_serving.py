"""The runtime an Inductor artifact carries besides the driver: how its output modules
run without Inductor (kernels bound from the verified cache, stand-ins for Inductor's
runtime names), the forward/backward pairs AOTAutograd partitioned (bound to
``autograd_serving.bind_autograd``), and the layout errors of its size asserts said in
the user's words.

Its functions are emitted into the Inductor artifacts that use them (single-graph and
Dynamo), with the Inductor prelude (``_compat.prelude.INDUCTOR_PRELUDE``), whose names the stubs
below stand for. The capture side calls the same functions (binding
what it lowered, as a load will), by these public names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# Emitted beside these functions wherever an artifact carries them.
from precompile.artifact.bytecode import compiled_source

if TYPE_CHECKING:
    import torch as _torch

    # Bound by the artifact prelude (precompile._compat.prelude), its metadata and driver's
    # functions.
    _KERNEL_DATA_PTR_ENV: str = ""
    _kernel_data_ptr: Any = None
    _INDUCTOR_ALIGN_BYTES: int = 64
    USER_INPUT_SHAPE_IDS: list[Any] = []
    PARAM_NAMES: list[str] = []
    BUFFER_NAMES: list[str] = []
    USER_INPUT_SHAPES: list[Any] = []
    GRAPH_INPUT_STRIDES: list[Any] = []

    def _memory_format(t: Any) -> str: ...

    def bind_autograd(
        name: str, spec: dict[str, Any], forward_call: Any, backward_call: Any
    ) -> Callable[..., list[Any]]: ...


def relabel_layout_error_inductor(error: AssertionError, flat: list[Any]) -> str | None:
    """Turn Inductor's own size/stride assert into a message naming the tensor and its
    memory format; any other AssertionError (a user's) passes through unchanged."""
    text = str(error)
    if not (("expected size" in text and "stride" in text) or "wrong number of dimensions" in text):
        return None
    names = [f"parameter {n!r}" for n in PARAM_NAMES] + [f"buffer {n!r}" for n in BUFFER_NAMES]
    names += [f"input {i}" for i, s in enumerate(USER_INPUT_SHAPES) if s is not None]
    for name, t, strides in zip(names, flat, GRAPH_INPUT_STRIDES):
        if strides is not None and tuple(t.stride()) != tuple(strides):
            return (
                f"precompile: {name} has strides {tuple(t.stride())} ({_memory_format(t)} "
                f"memory format) but was captured with strides {tuple(strides)}; the "
                f"Inductor backend bakes each tensor's shape and memory format "
                f"(invariants 3 and 6). Pass it in the captured layout (.contiguous(), or "
                f"the memory format it had at capture), or use backend='eager'"
            )
    note = ""
    if any(USER_INPUT_SHAPE_IDS):
        note = (
            " Inputs marked with one mark_unbacked shape_id are bound to one size: they "
            "must be equal at run time."
        )
    return (
        f"precompile: a tensor's shape or memory format differs from the traced example "
        f"(invariants 3 and 6); the Inductor backend bakes both.{note} Underlying: {text}"
    )


def inductor_runtime(bundle: dict[str, Any] | None) -> Any:
    """Resolve the inlined Inductor module's imports and bind its C++ kernels.

    With a usable cache bundle (the loader checked every kernel's sha256 against the
    envelope's digests, and the kernels' platform against this torch, Python and CPU)
    every kernel is a prebuilt extension module: written to a private temporary
    directory, loaded, the directory removed. Then ``torch._inductor`` is never imported
    and nothing compiles. Without one, each import resolves to the real Inductor name
    and kernels compile from the inlined source as the module executes, as Inductor's
    own output module does; ``compiled`` remembers them so a capture can cache them.
    """
    import contextlib
    import functools
    import hashlib
    import importlib
    import importlib.util
    import os
    import shutil
    import sys
    import tempfile
    import types
    import warnings

    prebuilt: dict[str, Any] = {}
    compiled: dict[str, Any] = {}
    if bundle and bundle.get("kernels"):
        os.environ[_KERNEL_DATA_PTR_ENV] = str(_kernel_data_ptr)
        directory = tempfile.mkdtemp(prefix="precompile-kernels-")
        try:
            for digest, data in bundle["kernels"].items():
                name = f"precompile_kernel_{digest[:32]}.kernel"
                module = sys.modules.get(name)
                if module is None:
                    path = os.path.join(directory, f"{digest}.so")
                    with open(path, "wb") as f:
                        f.write(data)
                    spec = importlib.util.spec_from_file_location(name, path)
                    # A path ending in .so always gets the extension-module loader.
                    assert spec is not None and spec.loader is not None
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    sys.modules[name] = module
                prebuilt[digest] = module.kernel
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    slim = bool(prebuilt) and bool(bundle and bundle.get("slim"))

    def real(module: str, name: str) -> Any:
        return getattr(importlib.import_module(module), name)

    warned: set[str] = set()

    class AsyncCompile:
        """Stands in for Inductor's: a prebuilt kernel when the cache has it, else the
        real compiler (imported only then; with a cache, after a warning naming the
        graph, once per graph)."""

        def __init__(self, graph: str | None = None) -> None:
            self._real: Any = None
            self._pending: list[tuple[str, Any]] = []
            self._graph = graph

        def _compiler(self) -> Any:
            if self._real is None:
                self._real = real("torch._inductor.async_compile", "AsyncCompile")()
            return self._real

        def cpp_pybinding(self, argtypes: list[str], source_code: str) -> Any:
            digest = hashlib.sha256(source_code.encode("utf-8")).hexdigest()
            kernel = prebuilt.get(digest)
            if kernel is not None:
                return kernel
            graph = self._graph or "the captured graph"
            if prebuilt and graph not in warned:
                warned.add(graph)
                category: type[Warning]
                try:
                    from precompile.errors import CacheFallbackWarning

                    category = CacheFallbackWarning
                except ImportError:
                    category = UserWarning
                warnings.warn(
                    f"precompile: the cache has no compiled kernel {digest[:16]} of graph "
                    f"{graph}; compiling it from the artifact's inlined source, which makes "
                    f"this load slow",
                    category,
                    stacklevel=2,
                )
            result = self._compiler().cpp_pybinding(argtypes, source_code)
            self._pending.append((digest, result))
            return result

        def wait(self, scope: dict[str, Any]) -> None:
            if self._real is not None:
                self._real.wait(scope)
            for digest, result in self._pending:
                compiled[digest] = result.result() if hasattr(result, "result") else result
            self._pending.clear()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._compiler(), name)

    def bias_addmm(
        inp: Any, mat1: Any, mat2: Any, *, out: Any = None, alpha: Any = 1, beta: Any = 1
    ) -> Any:
        # A broadcast bias row is passed to addmm as 1-D, as Inductor's extern kernel does.
        if (inp.stride(0) == 0 and inp.size(0) != 0) or inp.size(0) == 1:
            inp = inp[0]
        return _torch.addmm(inp, mat1, mat2, out=out, alpha=alpha, beta=beta)

    class ExternKernels:
        """Inductor's extern kernels that are plain torch functions; any other name comes
        from the real namespace (which imports Inductor)."""

        def __getattr__(self, name: str) -> Any:
            if name in ("mm", "addmm", "bmm", "baddbmm", "convolution", "_int_mm"):
                fn = getattr(_torch, name)
            elif name == "bias_addmm":
                fn = bias_addmm
            else:
                fn = getattr(real("torch._inductor.select_algorithm", "extern_kernels"), name)
            setattr(self, name, fn)
            return fn

    def maybe_profile(should_profile: bool, *args: Any, **kwargs: Any) -> Any:
        if should_profile:
            return real("torch._inductor.utils", "maybe_profile")(should_profile, *args, **kwargs)
        return contextlib.nullcontext()

    light = {
        ("torch._inductor.hooks", "run_intermediate_hooks"): lambda name, value: None,
        ("torch._inductor.utils", "maybe_profile"): maybe_profile,
        ("torch._inductor.codegen.memory_planning", "_align"): (
            lambda nbytes: (nbytes + _INDUCTOR_ALIGN_BYTES - 1) & -_INDUCTOR_ALIGN_BYTES
        ),
        ("torch._inductor.select_algorithm", "extern_kernels"): ExternKernels(),
    }

    def resolve(module: str, name: str, graph: str | None = None) -> Any:
        if (module, name) == ("torch._inductor.async_compile", "AsyncCompile"):
            return functools.partial(AsyncCompile, graph)
        if slim and (module, name) in light:
            return light[(module, name)]
        return real(module, name)

    return types.SimpleNamespace(resolve=resolve, compiled=compiled, slim=slim, prebuilt=prebuilt)


def bind_inductor_module(name: str, source: str, resolve: Any) -> Any:
    """Execute one inlined Inductor output module in a namespace of its own (several live
    in one multi-graph artifact, each defining ``call`` and its kernels) and return the
    positional-argument function Dynamo's transformed bytecode calls."""
    scope: dict[str, Any] = {
        "__name__": f"precompile_graph_{name}",
        "_inductor_import": lambda module, attribute: resolve(module, attribute, name),
    }
    exec(compiled_source(source, f"<precompile graph {name}>"), scope)
    call = scope["call"]

    def run(*args: Any) -> Any:
        return call(list(args))

    return run


def bind_aot_graph(
    name: str, spec: dict[str, Any], forward: str, backward: Any, resolve: Any
) -> Any:
    """Run a subgraph AOTAutograd partitioned (a training graph, or one that switches grad
    mode) from its inlined Inductor output modules, doing what AOTAutograd's runtime
    wrappers do around them for the cases the capture accepted (``spec``, from
    ``_compat.inductor.aot_runtime_spec``): ``autograd_serving.bind_autograd``, the one runtime of
    every captured forward/backward pair."""
    forward_call = bind_inductor_module(f"{name}_forward", forward, resolve)
    backward_call: Any = (
        bind_inductor_module(f"{name}_backward", backward, resolve) if backward else None
    )
    return bind_autograd(name, spec, forward_call, backward_call)
