"""The import prelude every emitted artifact carries, as text: the private names its
runtime reads, bound from torch under short aliases (artifacts run without this
package). Where the capture process runs the same runtime modules (``state_checks``,
``value_fingerprints``), it imports their bindings from here: one binding each, in the
artifact and in this process."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _python_dispatch

#: The hook dicts of an ``nn.Module`` whose entries change what its call computes, in the
#: order torch runs them; and torch's global ones. The one spelling of these names: both
#: tracers' records and checks read them from here (the capture) or from the prelude
#: every artifact carries (the runtime, through ``ARTIFACT_PRELUDE``).
MODULE_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_pre_hooks",
    "_backward_hooks",
)
GLOBAL_HOOK_DICTS = tuple("_global" + name for name in MODULE_HOOK_DICTS)
#: The names of torch's global module hook dicts, in the order
#: ``precompile.runtime.hook_records.global_hooks_fingerprint`` reads them.
GLOBAL_MODULE_HOOK_NAMES = (
    *GLOBAL_HOOK_DICTS,
    "_global_forward_hooks_with_kwargs",
    "_global_forward_hooks_always_called",
)

#: The import prelude of every emitted artifact: the names the driver reads, bound from
#: torch under short aliases. Private names appear here as text only.
ARTIFACT_PRELUDE = f"""\
MODULE_HOOK_DICTS = {MODULE_HOOK_DICTS!r}
GLOBAL_HOOK_DICTS = {GLOBAL_HOOK_DICTS!r}
GLOBAL_MODULE_HOOK_NAMES = {GLOBAL_MODULE_HOOK_NAMES!r}
import torch as _torch
import torch.utils._pytree as _pytree
import torch.utils._python_dispatch as _python_dispatch

_DisableAutocast = _torch._C._DisableAutocast
_any_autocast_enabled = _torch._C._is_any_autocast_enabled
_set_grad_enabled = _torch._C._set_grad_enabled
_dict_version = _torch._C._dynamo.guards.dict_version
_deterministic_enabled = _torch._C._get_deterministic_algorithms
# Whether autograd's anomaly detection is on, and checks backward outputs for NaN.
_anomaly_enabled = _torch.is_anomaly_enabled
_anomaly_check_nan = _torch.is_anomaly_check_nan_enabled
# Whether a torch.func transform (grad, vmap, ...) wrapped a tensor; grad's wrapper.
_functorch_wrapped = _torch._C._functorch.is_functorch_wrapped_tensor
_functorch_grad_wrapped = _torch._C._functorch.is_gradtrackingtensor
# torch.library's record of the kernels registered from Python ("ns/op/key"), and the
# dispatcher's own account of an operator's kernels (where each was registered).
import torch.library as _torch_library
_python_kernels = _torch_library._impls
_dispatch_dump = _torch._C._dispatch_dump
_TensorGuards = _torch._C._dynamo.guards.TensorGuards
dispatch_tls_local_exclude_set = _torch._C._dispatch_tls_local_exclude_set
privateuse1_backend_name = _torch._C._get_privateuse1_backend_name
# The active torch-function and dispatch modes (each call counts them: two C calls).
function_mode_depth = _torch._C._len_torch_function_stack
function_mode_at = _torch._C._get_function_stack_at
dispatch_mode_depth = _torch._C._len_torch_dispatch_stack
dispatch_mode_at = _torch._C._get_dispatch_stack_at
# Sets the active dispatch modes aside inside a with block (guards checked as eager's
# Python ran, under a mode that watches the graph's operations).
disable_dispatch_modes = _python_dispatch._disable_current_modes
_SKIP_DYNAMO_FRAMES = _torch._C._dynamo.eval_frame._FrameExecStrategy(
    _torch._C._dynamo.eval_frame._FrameAction.SKIP, _torch._C._dynamo.eval_frame._FrameAction.SKIP
)


# The dispatch keys torch.inference_mode() takes out of (or adds into) the thread's
# dispatch-key state. A tensor guard compares a tensor's keys under that state, so a
# Dynamo artifact checks its guards (and runs) under the state of ordinary code: a call
# under inference mode then meets the guards an ordinary call does. Grad mode stays off,
# and the tensors ops make are still inference tensors (inference mode itself is on).
with _torch.inference_mode(False):
    _ORDINARY_INCLUDE = _torch._C._dispatch_tls_local_include_set()
    _ORDINARY_EXCLUDE = _torch._C._dispatch_tls_local_exclude_set()
with _torch.inference_mode():
    _INFERENCE_EXCLUDE = _torch._C._dispatch_tls_local_exclude_set() - _ORDINARY_EXCLUDE
    _INFERENCE_INCLUDE = _ORDINARY_INCLUDE - _torch._C._dispatch_tls_local_include_set()
del _ORDINARY_INCLUDE, _ORDINARY_EXCLUDE
# An inference tensor is an ordinary one without the autograd keys: with autograd's
# functionality in the included keys (each tensor adds its own backend), a tensor made
# during the call -- one a graph returns and the next frame is passed -- has the keys
# of the ordinary tensor the capture saw, to its guards and to the kernels (grad mode
# is off: autograd records nothing, as in ordinary no_grad code).
_INFERENCE_INCLUDE = _INFERENCE_INCLUDE | _torch._C.DispatchKeySet(
    _torch._C.DispatchKey.AutogradFunctionality
)


def _ordinary_dispatch():
    return _torch._C._ForceDispatchKeyGuard(
        _torch._C._dispatch_tls_local_include_set() | _INFERENCE_INCLUDE,
        _torch._C._dispatch_tls_local_exclude_set() - _INFERENCE_EXCLUDE,
    )


def _opaque_to_dynamo(fn):
    # An artifact called inside torch.compile runs as one opaque call: Dynamo does not
    # trace into it (the attribute torch.compiler.disable sets; a graph break there) nor
    # compile its frames or those it calls (the frame strategy). Without this, Dynamo
    # inlines the runtime, whose module (the artifact) it cannot import.
    fn._torchdynamo_disable = True
    _torch._C._dynamo.eval_frame.set_code_exec_strategy(fn.__code__, _SKIP_DYNAMO_FRAMES)
    return fn


# What mark_dynamic / mark_unbacked / mark_static leave on a tensor.
_DYNAMO_DIM_MARKS = (
    "_has_dynamo_dim_marking",
    "_dynamo_dynamic_indices",
    "_dynamo_weak_dynamic_indices",
    "_dynamo_unbacked_indices",
    "_dynamo_strict_unbacked_indices",
    "_dynamo_static_indices",
    "_dynamo_shape_ids",
    "_dynamo_unbacked_bounds",
)
"""


#: The prelude's public names for the modules emitted whole (state_checks), which the
#: capture imports from here: one binding each, in the artifact and in this process.
dispatch_tls_local_exclude_set = torch._C._dispatch_tls_local_exclude_set


privateuse1_backend_name = torch._C._get_privateuse1_backend_name


function_mode_depth = torch._C._len_torch_function_stack


function_mode_at = torch._C._get_function_stack_at


dispatch_mode_depth = torch._C._len_torch_dispatch_stack


dispatch_mode_at = torch._C._get_dispatch_stack_at


disable_dispatch_modes = _python_dispatch._disable_current_modes


#: What ``autograd_serving.bind_autograd`` needs besides ARTIFACT_PRELUDE: view replay
#: (AOTAutograd turns it on around its forward) and the frame strategy that keeps
#: Dynamo from compiling the runtime's own frames.
AUTOGRAD_PRELUDE = """\
_view_replay_enabled = _torch._C._is_view_replay_enabled
_set_view_replay_enabled = _torch._C._set_view_replay_enabled
_set_code_exec_strategy = _torch._C._dynamo.eval_frame.set_code_exec_strategy
_SKIP_FRAMES = _torch._C._dynamo.eval_frame._FrameExecStrategy(
    _torch._C._dynamo.eval_frame._FrameAction.SKIP, _torch._C._dynamo.eval_frame._FrameAction.SKIP
)
"""


#: What an Inductor artifact's runtime needs besides ARTIFACT_PRELUDE: how a prebuilt
#: kernel (a Python extension module) finds torch's tensor-data accessor, the
#: allocation alignment of torch 2.13's generated code, and AUTOGRAD_PRELUDE (training
#: subgraphs and grad inputs are served through ``bind_autograd``).
INDUCTOR_PRELUDE = (
    """\
_KERNEL_DATA_PTR_ENV = "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"
_kernel_data_ptr = _torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr
_INDUCTOR_ALIGN_BYTES = 64
"""
    + AUTOGRAD_PRELUDE
)


#: Globals that FX-generated graph code references without defining them.
FX_GRAPH_GLOBALS = """\
import torch
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree
from torch import device

inf = float("inf")
nan = float("nan")
NoneType = type(None)


def _kernel(op):
    # What calling the op overload runs (OpOverload.__call__ is `return self._op(*args,
    # **kwargs)`), bound once: the graph calls the C++ operator handle directly instead
    # of through the Python wrapper on every call. Anything else is returned unchanged.
    return getattr(op, "_op", op)
"""


#: Bound in single-graph artifacts: the module holding torch's global module hook dicts,
#: and a function reading them from it on each check (``m._global_forward_hooks = {...}``
#: replaces a dict whole; torch reads the module's global, so must the check).
SINGLE_GRAPH_STATE_PRELUDE = f"""\
import torch.nn.modules.module as _torch_nn_module


def _global_module_hooks():
    return tuple(getattr(_torch_nn_module, name) for name in {GLOBAL_MODULE_HOOK_NAMES!r})
"""


def global_module_hooks() -> tuple[dict[Any, Any], ...]:
    """The dicts behind ``torch.nn.modules.module.register_module_forward_hook`` and
    friends, as SINGLE_GRAPH_STATE_PRELUDE's ``_global_module_hooks`` reads them."""
    import torch.nn.modules.module as m

    return tuple(getattr(m, name) for name in GLOBAL_MODULE_HOOK_NAMES)


#: What an artifact on the Dynamo-free path binds: the C++ guard classes, what the
#: saved-tensors-hooks guard reads, and how backend functions are kept out of any
#: eval-frame callback (what ``torch._dynamo.disable`` would do), none of which imports
#: ``torch._dynamo``.
PLAIN_GUARDS_PRELUDE = """\
_guard_classes = _torch._C._dynamo.guards
_dispatch_key_set = _torch._C.DispatchKeySet
_dispatch_keys = _torch._C._dispatch_keys
_set_code_exec_strategy = _torch._C._dynamo.eval_frame.set_code_exec_strategy
_SKIP_FRAMES = _torch._C._dynamo.eval_frame._FrameExecStrategy(
    _torch._C._dynamo.eval_frame._FrameAction.SKIP, _torch._C._dynamo.eval_frame._FrameAction.SKIP
)


class _DynamoUtilsStandIn:
    # What Dynamo's transformed bytecode reads from torch._dynamo.utils (checked at emit:
    # these functions and nothing else), doing what they do: a profiler range around the
    # bytecode ahead of a graph when the profiler is on, and a tensor's size, stride and
    # storage offset read for a dynamic dimension.

    # With the profiler off (every served call but a profiled one) there is no range:
    # enter answers None and exit does nothing, with no context object made per call.
    @staticmethod
    def record_pregraph_bytecode_enter():
        if not _torch.autograd.profiler._is_profiler_enabled:
            return None
        cm = _torch._C._profiler._RecordFunctionFast("Pregraph bytecode")
        cm.__enter__()
        return cm

    @staticmethod
    def record_pregraph_bytecode_exit(cm):
        if cm is not None:
            cm.__exit__(None, None, None)

    @staticmethod
    def call_size(x, i):
        return x.size(i)

    @staticmethod
    def call_stride(x, i):
        return x.stride(i)

    @staticmethod
    def call_storage_offset(x):
        return x.storage_offset()


from torch._functorch._aot_autograd.utils import (
    saved_tensors_hooks_are_inlineable as _hooks_inlineable,
    top_saved_tensors_hooks as _top_saved_tensors_hooks,
)


def _saved_tensors_hooks_inlineable():
    return _hooks_inlineable(_top_saved_tensors_hooks())
"""


def python_kernels_registry() -> Any:
    """torch.library's set of the kernels registered from Python (``"aten/relu/CPU"``),
    the set the artifact prelude binds as ``_python_kernels``."""
    import torch.library

    return torch.library._impls
