"""The torch-compatibility layer: every private torch name of the project lives here.

Supporting the next torch release means changing this package (and the text it hands the
emitter for artifacts), nowhere else -- ``make lint`` checks that no other module names
private torch (``tools/private_names.py``). Tested against torch 2.13.x. One module
per role:

- ``tracing``: make_fx, fake tensors and AOTAutograd's joint trace (capture side).
- ``dynamo``: Dynamo's compile, package and guards (capture side).
- ``inductor``: Inductor lowering and AOTAutograd's runtime decisions (capture side).
- ``prelude``: the import prelude artifacts carry, as text (artifacts must run without
  this package), and the same bindings for the capture process.
- ``runtime``: the Dynamo and Inductor internals an artifact's runtime reaches, as
  functions emitted verbatim into artifacts.
- ``guard_translation``: Dynamo's guards as a Dynamo-free program (capture side) and
  what an artifact serving it binds instead of Dynamo (prelude text and a runtime
  function emitted verbatim), so it loads without importing ``torch._dynamo``.
- ``guard_recorder``: the record of every call Dynamo's guard builder makes on the C++
  guard managers, which ``guard_translation`` turns into that program (capture side).
- ``kernel_platform``: what a compiled kernel needs of the machine, and whether this
  one has it (cheap probes, no compiler).
- ``patching``: how a capture swaps a torch function for the length of a block.
- ``symbolic``: the integer expressions a Dynamo subgraph computes from its dynamic
  integer inputs, as trees an artifact evaluates without sympy (capture side).

Importing any of them is cheap: heavy private modules are imported on first use.
"""
