"""The runtime: every module here is emitted into artifacts as text and runs there.

Named by artifact kind: ``single_graph*`` for make_fx's artifacts, ``multigraph*`` for
Dynamo's; the rest is carried by both (``refusal``, ``state_checks``, ``value_fingerprints``,
``fingerprint_differences``, ``version_watch``, ``surface_checks``, ``source_digest``,
``guard_text``) or by artifacts with lowered graphs
(``inductor_serving``, ``autograd_serving``, ``lowered_inputs``). ``capturing.carried`` declares,
per artifact kind, which of them an artifact carries. These modules import nothing but
typing names at module level: an artifact runs where this package is not installed, and
what one module uses of another is declared under ``TYPE_CHECKING`` and checked
(tests/core/runtime/test_runtime_interfaces.py). The capture side imports them to run the same
code in process.
"""
