"""The capture side: runs a tracer on the user's function and turns what it saw into an
artifact. Named by tracer: ``fx_*`` is make_fx's (single-graph artifacts), ``dynamo_*``
Dynamo's (multi-graph artifacts); each recorder pairs with the runtime check that reads
its record (``fx_dependencies`` -> ``runtime.single_graph_checks``/``runtime.value_fingerprints``,
``dynamo_dependencies`` -> ``runtime.multigraph_dependencies``, which composes
``dynamo_name_records`` -> ``runtime.multigraph_name_checks`` and
``dynamo_identity_records``/``dynamo_value_records`` ->
``runtime.multigraph_argument_checks``). The rest is shared by
both tracers: lowering (``backends``, ``inductor_backend``, ``graph_code``), the
library-surface recorder, the emitter's common parts (``emit``). Imports torch freely;
never imported by an artifact, nor by the language server (docs/architecture.md).
"""
