"""The runtime an Inductor artifact carries besides the driver: how its output modules
run without Inductor (kernels bound from the verified cache, stand-ins for Inductor's
runtime names), forward/backward pairs served through one autograd.Function, and the
layout errors of its size asserts said in the user's words.

Its functions are emitted into the Inductor artifacts that use them (single-graph and
Dynamo), with the Inductor prelude (``_compat.prelude.INDUCTOR_PRELUDE``), whose names the stubs
below stand for. The capture side calls the same functions (binding
what it lowered, as a load will), by these public names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import torch as _torch

    # Bound by the artifact prelude (precompile._compat.prelude), its metadata and driver's
    # functions.
    _KERNEL_DATA_PTR_ENV: str = ""
    _kernel_data_ptr: Any = None
    _INDUCTOR_ALIGN_BYTES: int = 64
    _view_replay_enabled: Callable[[], bool] = bool
    _set_view_replay_enabled: Callable[[bool], None] = print
    _set_code_exec_strategy: Any = None
    _SKIP_FRAMES: Any = None
    _set_grad_enabled: Callable[[bool], None] = print
    _any_autocast_enabled: Callable[[], bool] = bool
    USER_INPUT_SHAPE_IDS: list[Any] = []
    PARAM_NAMES: list[str] = []
    BUFFER_NAMES: list[str] = []
    USER_INPUT_SHAPES: list[Any] = []
    GRAPH_INPUT_STRIDES: list[Any] = []

    def _fail(message: str, invariant: int | None = None) -> NoReturn: ...

    def _memory_format(t: Any) -> str: ...


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
    exec(compile(source, f"<precompile graph {name}>", "exec"), scope)
    call = scope["call"]

    def run(*args: Any) -> Any:
        return call(list(args))

    return run


def bind_aot_graph(
    name: str, spec: dict[str, Any], forward: str, backward: Any, resolve: Any
) -> Any:
    """Run a subgraph AOTAutograd partitioned (a training graph, or one that switches grad
    mode) from its inlined Inductor output modules, doing what AOTAutograd's runtime
    wrappers do around them -- for the cases the capture accepted (``spec``, from
    ``_compat.inductor.aot_runtime_spec``): detach inputs whose gradient is known to be None, run
    the forward in an autograd function that saves what the backward needs (tensors and
    sizes), mark outputs that need no gradient, coerce incoming gradients to the layout
    the backward was compiled for, copy mutated inputs back, restore grad mode."""
    forward_call = bind_inductor_module(f"{name}_forward", forward, resolve)
    backward_call: Any = (
        bind_inductor_module(f"{name}_backward", backward, resolve) if backward else None
    )
    detach = tuple(spec["detach"])
    mutations = tuple(spec["mutations"])
    leaves = frozenset(spec["leaf_mutations"])
    bump = tuple(spec["bump_versions"])
    grad_mode_after = spec["grad_enabled_mutation"]
    detach_outputs = spec.get("detach_outputs", False)
    expected = len(mutations) + spec["outputs"]

    def finish(args: list[Any], outs: Any) -> Any:
        outs = list(outs)
        if len(outs) != expected:
            _fail(
                f"precompile: graph {name} returned {len(outs)} values where it was "
                f"captured returning {expected}; this is a precompile bug, please report it"
            )
        for i, index in enumerate(mutations):
            original = args[index]
            if index in leaves and original.requires_grad:
                original.detach().copy_(outs[i])
            else:
                original.copy_(outs[i])
        if bump:
            _torch.autograd.graph.increment_version(tuple(args[i] for i in bump))
        if grad_mode_after is not None:
            _set_grad_enabled(grad_mode_after)
        return outs[len(mutations) :]

    if backward_call is None:

        def run_inference(*args: Any) -> Any:
            inputs = list(args)
            enabled = _torch.is_grad_enabled()
            if enabled:
                _set_grad_enabled(False)
            try:
                outs = forward_call(*inputs)
            finally:
                if enabled:
                    _set_grad_enabled(True)
            if detach_outputs:
                outs = [
                    o.detach() if isinstance(o, _torch.Tensor) and o.requires_grad else o
                    for o in outs
                ]
            return finish(inputs, outs)

        return run_inference

    saved = slice(*spec["saved"])
    saved_no_check = slice(*spec["saved_no_check"])
    symints = slice(*spec["symints"])
    returns = spec["forward_returns"]
    non_differentiable = tuple(spec["non_differentiable"])
    grad_outs = spec["grad_outs"]
    tangents = tuple(
        (
            position,
            None
            if fmt is None
            else (
                ("format", getattr(_torch, fmt[1]))
                if fmt[0] == "format"
                else ("strided", tuple(fmt[1]), tuple(fmt[2]))
            ),
        )
        for position, fmt in spec["tangents"]
    )

    def tangent(grad: Any, fmt: Any) -> Any:
        if fmt is None or not isinstance(grad, _torch.Tensor):
            return grad
        if fmt[0] == "format":
            if not grad.is_contiguous(memory_format=fmt[1]):
                grad = grad.contiguous(memory_format=fmt[1])
            return grad
        if tuple(grad.shape) == fmt[1] and grad.stride() == fmt[2]:
            return grad
        restrided = _torch.empty_strided(
            fmt[1], fmt[2], dtype=grad.dtype, device=grad.device, layout=grad.layout
        )
        restrided.copy_(grad)
        return restrided

    class CompiledFunction(_torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            outs = list(forward_call(*args))
            ctx.save_for_backward(*[t.detach() if t._is_view() else t for t in outs[saved]])
            ctx.unchecked = [t.detach() if t._is_view() else t for t in outs[saved_no_check]]
            ctx.symints = outs[symints]
            raw = outs[:returns]
            ctx.mark_non_differentiable(
                *[raw[i] for i in non_differentiable if isinstance(raw[i], _torch.Tensor)]
            )
            ctx._materialize_non_diff_grads = False
            return tuple(raw)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            if len(grads) != grad_outs:
                _fail(f"precompile: graph {name} got {len(grads)} gradients, expected {grad_outs}")
            if _torch.is_grad_enabled():
                _fail(
                    f"precompile: graph {name} was captured for a first-order backward; "
                    f"backward(create_graph=True) through it (a double backward) is not "
                    f"supported -- capture the double backward inside fn instead"
                )
            if _any_autocast_enabled():
                _fail(
                    f"precompile: graph {name}'s backward runs under torch.autocast, but "
                    f"its captured backward holds the dtypes of a backward without it: "
                    f"eager would recast some of its ops. Run the backward outside the "
                    f"autocast block (as PyTorch recommends), or run this computation eagerly"
                )
            all_args = [
                *ctx.symints,
                *ctx.saved_tensors,
                *ctx.unchecked,
                *(tangent(grads[position], fmt) for position, fmt in tangents),
            ]
            ctx.unchecked = None
            return tuple(backward_call(*all_args))

    def run_training(*args: Any) -> Any:
        inputs = list(args)
        for index in detach:
            if isinstance(inputs[index], _torch.Tensor):
                inputs[index] = inputs[index].detach()
        replay = _view_replay_enabled()
        try:
            if not replay:
                _set_view_replay_enabled(True)
            with _torch.enable_grad():
                outs = CompiledFunction.apply(*inputs)
        finally:
            if _view_replay_enabled() != replay:
                _set_view_replay_enabled(replay)
        return finish(list(args), outs)

    # The autograd engine calls backward from whatever frame runs loss.backward(); where
    # Dynamo's frame callback is active (a capture, an installed artifact) it must not
    # try to compile this runtime, as it never compiles AOTAutograd's own.
    for code in (
        CompiledFunction.forward.__code__,
        CompiledFunction.backward.__code__,
        run_training.__code__,
    ):
        _set_code_exec_strategy(code, _SKIP_FRAMES)
    return run_training
