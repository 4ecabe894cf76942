"""Issue 14, part 1: a Dynamo + Inductor artifact loaded with its cache compiles nothing.

Real shapes, not a tiny Linear: a ResNet-18 laid out as torchvision's (inference at two
batch sizes, so a second, dynamic variant exists; and a training step) and a small
transformer block. Each loads in a fresh process with an empty TORCHINDUCTOR_CACHE_DIR
and an empty TMPDIR, under a spy on process creation (tests.harness.watched_load): the
answer (for training: loss, every gradient and every buffer) matches eager, no process
starts -- not even ``g++ --version`` -- and neither Inductor's code generator and
compiler nor AOTAutograd is imported.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

import precompile
from tests.fixtures import zero_compile_models as models
from tests.harness import run_json, watched_load

#: Modules whose import means the load reached Inductor's code generator or compiler, or
#: AOTAutograd's compile path. (``import torch`` alone imports
#: ``torch._functorch._aot_autograd.utils``; importing ``torch._dynamo``, which serving
#: a Dynamo artifact still does -- part 2 of issue 14 -- imports the modules
#: ``torch._inductor.cpp_builder`` and ``..._aot_autograd.runtime_wrappers`` without
#: using them: what would use them, a compiler process, the spawn spy catches.)
COMPILER_MODULES = re.compile(
    r"^torch\._inductor\.(codegen|compile_fx|graph|scheduler|lowering|codecache)\b"
    r"|^torch\._functorch\.aot_autograd$"
    r"|^torch\._functorch\._aot_autograd\.(graph_compile|jit_compile_runtime_wrappers)$"
)

SERVE_INFER = """
from tests.fixtures import zero_compile_models as m
model = m.{build}
error = 0.0
for batch in {batches}:
    x = m.{inputs}(batch)
    error = max(error, m.mismatch(run(model, x), m.infer(model, x)))
"""

SERVE_TRAIN = """
import copy
from tests.fixtures import zero_compile_models as m
model = m.{build}
reference = copy.deepcopy(model)
args = {args}
error = 0.0
for _ in range(2):  # the second step accumulates onto the first step's gradients
    served, expected = run(model, *args), m.{fn}(reference, *args)
    error = max(error, m.mismatch(served, expected), m.mismatch(m.state(model), m.state(reference)))
"""


def _capture(
    directory: Path, name: str, fn: Any, calls: list[tuple[Any, ...]], training: bool
) -> tuple[str, str]:
    paths = str(directory / f"{name}.py"), str(directory / f"{name}.cache")
    with precompile.capture(
        fn,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.DynamoTracer(),
        backend="inductor",
        training=training,
    ) as cap:
        for args in calls:
            cap(*args)
    return paths


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    directory = tmp_path_factory.mktemp("zero-compile")
    resnet_eval = models.resnet(False)
    out = {
        "resnet_infer": _capture(
            directory,
            "resnet_infer",
            models.infer,
            [(resnet_eval, models.images(2)), (resnet_eval, models.images(3))],
            training=False,
        ),
        "resnet_train": _capture(
            directory,
            "resnet_train",
            models.train_step,
            [(models.resnet(True), models.images(4, 64), models.labels(4))],
            training=True,
        ),
        "block_infer": _capture(
            directory, "block_infer", models.infer, [(models.block(), models.tokens(2))], False
        ),
        "block_train": _capture(
            directory,
            "block_train",
            models.block_train_step,
            [(models.block(), models.tokens(2))],
            training=True,
        ),
    }
    return out


def _assert_compiles_nothing(result: dict[str, Any]) -> None:
    compiler = [m for m in result["modules"] if COMPILER_MODULES.match(m)]
    assert (
        result["spawned"] == []
    ), f"the load started processes {result['spawned']}; the first from:\n{result['first_stack']}"
    assert compiler == [], f"the load imported the compiler: {compiler}"
    assert result["cache_files"] == [], "the load wrote into an Inductor cache folder"
    # The inlined Inductor modules and the guard checks come from the cache as bytecode.
    from_text = [
        f
        for f in result["compiled_text"]
        if f.startswith(("<precompile graph", "<precompile guards"))
    ]
    assert from_text == [], f"the load compiled from text: {from_text}"


@pytest.mark.parametrize(
    "name, serve",
    [
        (
            "resnet_infer",
            SERVE_INFER.format(build="resnet(False)", inputs="images", batches=(2, 3, 5)),
        ),
        ("block_infer", SERVE_INFER.format(build="block()", inputs="tokens", batches=(2,))),
        (
            "resnet_train",
            SERVE_TRAIN.format(
                build="resnet(True)", fn="train_step", args="(m.images(4, 64), m.labels(4))"
            ),
        ),
        (
            "block_train",
            SERVE_TRAIN.format(build="block()", fn="block_train_step", args="(m.tokens(2),)"),
        ),
    ],
)
def test_a_cached_load_matches_eager_and_compiles_nothing(
    captured: dict[str, tuple[str, str]], tmp_path: Path, name: str, serve: str
) -> None:
    artifact, cache = captured[name]
    result = watched_load(artifact, cache, serve, tmp_path / "inductor-cache")
    assert result["error"] == 0.0, f"{name}: served results differ from eager by {result['error']}"
    _assert_compiles_nothing(result)


WARNINGS_LOAD = """
import json, warnings
import torch, precompile
warnings.simplefilter("ignore", precompile.ArtifactTrustWarning)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", precompile.CacheFallbackWarning)
    run = precompile.load({artifact!r}, {cache!r})
{serve}
print(json.dumps({{
    "error": error,
    "warnings": [str(w.message) for w in caught if w.category is precompile.CacheFallbackWarning],
}}))
"""


def test_a_cache_without_one_kernel_warns_once_naming_the_graph(
    captured: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    # A cache that lacks a kernel (consistently: its digest is gone too) is still used
    # for every other kernel; the missing one compiles from the inlined source, after
    # one warning that names the graph and the kernel.
    import torch

    artifact, cache = captured["block_train"]
    envelope = torch.load(cache, weights_only=True)
    kernels = envelope["bundle"]["kernels"]
    dropped = sorted(kernels)[0]
    del kernels[dropped]
    del envelope["digests"][f"kernels/{dropped}"]
    partial = Path(cache).with_name("block_train_partial.cache")
    torch.save(envelope, partial)
    serve = SERVE_TRAIN.format(build="block()", fn="block_train_step", args="(m.tokens(2),)")
    (tmp_path / "inductor").mkdir()
    result = run_json(
        WARNINGS_LOAD.format(
            artifact=artifact, cache=str(partial), serve=textwrap.indent(serve, "    ")
        ),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    assert result["error"] == 0.0
    assert len(result["warnings"]) == 1, result["warnings"]
    message = result["warnings"][0]
    assert dropped[:16] in message and "of graph __compiled_fn_" in message, message
