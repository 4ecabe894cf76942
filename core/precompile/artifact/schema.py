"""The metadata schema of each artifact kind: every key an emitter writes, with its type.

One record type per kind (``SERVING_MODE`` says which): the emitters build their metadata
as these (mypy checks each key they write), the runtime modules read them as the
``TYPE_CHECKING`` constants they declare, and docs/artifact-format.md documents every key
(tests/core/runtime/test_runtime_interfaces.py checks all three agree with what artifacts carry).
Values are literals (``metadata.render_assignment``): what ``ast.literal_eval`` gives back.
A table of keys rather than behaviour, so it stays one module however many keys it grows.
"""

# No ``from __future__ import annotations``: TypedDict reads ``NotRequired`` from the
# evaluated annotations (``__required_keys__``, which the tests check artifacts against).
from typing import Any, NotRequired, TypedDict


class _Common(TypedDict):
    FORMAT: str
    FORMAT_VERSION: int
    BACKEND: str
    TRACER: str
    SERVING_MODE: str
    FN_NAME: str
    FN_MODULE: str
    AMBIENT_MODES: list[str]
    MODES_SEE_OPS: bool
    GLOBAL_READS: list[dict[str, Any]]
    LIBRARY_SURFACE: list[Any]
    FUNCTION_SOURCES: list[Any]
    #: The functions that made the example inputs (``capture(inputs_from=...)``), in
    #: ``FUNCTION_SOURCES``' shape: read by ``precompile check``, never by a load.
    INPUT_SOURCES: list[Any]
    TORCH_VERSION: str
    PYTHON_VERSION: list[int]
    SOURCES: list[dict[str, str]]


class SingleGraphMetadata(_Common):
    """make_fx's artifacts (``SERVING_MODE = 'single_graph'``)."""

    NUM_POSITIONAL_ARGS: int
    MODULE_POSITIONS: list[int]
    PARAM_NAMES: list[str]
    PARAM_SHAPES: list[tuple[int, ...]]
    PARAM_DTYPES: list[str]
    PARAM_DEVICES: list[str]
    PARAM_REQUIRES_GRAD: list[bool]
    BUFFER_NAMES: list[str]
    BUFFER_SHAPES: list[tuple[int, ...]]
    BUFFER_DTYPES: list[str]
    BUFFER_DEVICES: list[str]
    STATE_ALIASES: list[list[str]]
    MODULE_TRAINING: list[Any]
    MODULE_READS: list[Any]
    MODULE_READ_NOTES: list[Any]
    TRAINING: bool
    GRAD_PARAM_INDICES: list[int]
    IN_SPEC: str
    OUT_SPEC: str
    USER_INPUT_SHAPES: list[Any]
    USER_INPUT_DTYPES: list[str | None]
    USER_INPUT_DEVICES: list[str | None]
    USER_INPUT_BOUNDS: list[Any]
    USER_INPUT_SHAPE_IDS: list[Any]
    USER_INPUT_CONSTANTS: list[Any]
    USER_INPUT_ALIASES: list[list[Any]]
    KEYED_DICTS: list[Any]
    INPUT_LAYOUT_COPY: list[str | None]
    USER_INPUT_REQUIRES_GRAD: list[bool | None]
    GRAPH_INPUT_STRIDES: list[Any]
    OUTPUT_DETACH: list[int]
    INPUT_MUTATIONS: dict[str, Any] | None
    AUTOGRAD: dict[str, Any] | None
    DEFAULT_DTYPE: str
    AUTOCAST: list[list[str]]
    STATE_READS: dict[str, Any]
    MODULE_STATE: list[Any]
    CLASS_STATE: list[Any]
    READ_NAMES: list[str]
    GLOBAL_HOOKS: dict[str, Any]
    PROCESS_STATE: list[list[Any]]
    ENTRY: dict[str, Any] | None
    GRAD_ACCESS: list[Any]
    GRAPH_OPS: int


class MultiGraphDependencies(TypedDict):
    """What Dynamo's artifacts check beyond the guards (``runtime.multigraph_dependencies``),
    as ``capturing.dynamo_dependencies`` records it."""

    MODULE_HOOKS: dict[str, Any]
    GLOBAL_READS: list[dict[str, Any]]
    ARG_IDENTITIES: list[Any]
    FLOAT_ZEROS: list[Any]
    ORDERED_DICTS: list[Any]
    CLASS_ATTRS: list[Any]
    BUILTIN_READS: list[Any]
    TRACED_FUNCS: list[dict[str, str]]
    LIBRARY_SURFACE: list[Any]
    GRAD_MODE_READ: str
    ARG_RELATIONS: list[Any]
    GRAD_FLAGS: dict[str, Any]
    PROCESS_STATE: list[list[Any]]


class MultiGraphMetadata(_Common, MultiGraphDependencies):
    """Dynamo's artifacts (``SERVING_MODE = 'standalone'`` or ``'installed'``)."""

    ARTIFACT_TAG: str
    GRAD_MODE: bool
    GLOBAL_STATE: dict[str, Any]
    FRAMES: list[dict[str, Any]]
    GUARDS: list[dict[str, Any]]
    GUARD_RUNTIME: dict[str, Any]
    DYNAMO_GLOBALS: list[list[Any]]
    #: Installed artifacts only: the frames Dynamo ran eagerly, ``[name, first line]``.
    EAGER_FRAMES: NotRequired[list[list[Any]]]


#: The schema of each ``SERVING_MODE``.
SCHEMAS: dict[str, type] = {
    "single_graph": SingleGraphMetadata,
    "standalone": MultiGraphMetadata,
    "installed": MultiGraphMetadata,
}
