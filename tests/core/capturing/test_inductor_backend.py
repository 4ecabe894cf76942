"""The Inductor backend: a cached load compiles nothing and imports no compiler; a cache
built for another CPU falls back to compiling; python_code alone compiles its inlined
kernels; layout mismatches name the tensor and its memory format; a user assert keeps
its own message."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from precompile import CacheFallbackWarning, PrecompileError
from tests.fixtures.models import ConvBN, convbn_fn
from tests.harness import run_json, run_python, watched_load


@pytest.fixture(scope="module")
def convbn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("inductor")
    paths = directory / "convbn.py", directory / "convbn.cache"
    torch.manual_seed(0)
    with precompile.capture(
        convbn_fn,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.MakeFxTracer(),
        backend="inductor",
    ) as cap:
        cap(ConvBN().eval(), torch.randn(2, 3, 6, 6))
    return paths


def test_cached_load_compiles_nothing(convbn: tuple[Path, Path], tmp_path: Path) -> None:
    serve = """
from tests.fixtures.models import ConvBN, convbn_fn
torch.manual_seed(7)
model, x = ConvBN().eval(), torch.randn(2, 3, 6, 6)
error = (run(model, x) - convbn_fn(model, x)).abs().max().item()
"""
    result = watched_load(str(convbn[0]), str(convbn[1]), serve, tmp_path / "inductor-cache")
    compiler = [m for m in result["modules"] if m.startswith(("torch._inductor", "torch._dynamo"))]
    assert result["error"] < 1e-5
    assert result["spawned"] == [], "a compiler or worker process was started"
    assert compiler == [], "the load imported the compiler"
    assert result["cache_files"] == [], "the load wrote into TORCHINDUCTOR_CACHE_DIR"


def test_python_code_alone_compiles_its_inlined_kernels(
    convbn: tuple[Path, Path], tmp_path: Path
) -> None:
    code = f"""
import torch, warnings
warnings.simplefilter("ignore")
import sys; sys.modules["precompile"] = None
from tests.fixtures.models import ConvBN, convbn_fn
namespace = {{"__name__": "artifact"}}
exec(compile(open({str(convbn[0])!r}).read(), "artifact", "exec"), namespace)
torch.manual_seed(3)
model, x = ConvBN().eval(), torch.randn(2, 3, 6, 6)
torch.testing.assert_close(namespace["forward"](model, x), convbn_fn(model, x))
print("kernels compiled:", len(namespace["_INDUCTOR"].compiled))
"""
    proc = run_python(code, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "empty"))
    assert proc.returncode == 0, proc.stderr
    assert "kernels compiled: 0" not in proc.stdout


def _doctored(cache: Path, out: Path, **requires: Any) -> Path:
    envelope = torch.load(cache, weights_only=True)
    envelope["bundle"]["requires"].update(requires)
    buffer = io.BytesIO()
    torch.save(envelope, buffer)
    out.write_bytes(buffer.getvalue())
    return out


@pytest.mark.parametrize(
    ("requires", "why"),
    [
        ({"isa": "sve256", "isa_flags": ["sve256"]}, "lacks 'sve256'"),
        ({"torch": "2.99.0"}, "torch '2.99.0'"),
        ({"python_abi": ".cpython-399-x86_64-linux-gnu.so"}, "python_abi"),
    ],
)
def test_kernels_for_another_machine_fall_back_to_source(
    convbn: tuple[Path, Path], tmp_path: Path, requires: dict[str, Any], why: str
) -> None:
    cache = _doctored(convbn[1], tmp_path / "doctored.cache", **requires)
    with pytest.warns(CacheFallbackWarning, match=why):
        run = precompile.load(convbn[0], cache)
    assert not run._namespace["_INDUCTOR"].prebuilt
    torch.manual_seed(5)
    model, x = ConvBN().eval(), torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(run(model, x), convbn_fn(model, x))


def test_channels_last_weight_is_refused_naming_memory_format(convbn: tuple[Path, Path]) -> None:
    run = precompile.load(*convbn)
    model, x = ConvBN().eval(), torch.randn(2, 3, 6, 6)
    model.conv.weight.data = model.conv.weight.data.to(memory_format=torch.channels_last)
    with pytest.raises(PrecompileError) as info:
        run(model, x)
    assert info.value.invariant == 6
    assert "parameter 'conv.weight'" in str(info.value) and "channels_last memory format" in str(
        info.value
    )
    model.conv.weight.data = model.conv.weight.data.contiguous()
    # An input in another layout is served through a copy in the captured one (issue 26),
    # said with a LayoutCopyWarning; parameters stay refused.
    x_cl = x.to(memory_format=torch.channels_last)
    with pytest.warns(precompile.LayoutCopyWarning, match=r"input 0 has strides \(108, 1, 18, 3\)"):
        torch.testing.assert_close(run(model, x_cl), convbn_fn(model, x_cl))
    torch.testing.assert_close(run(model, x), convbn_fn(model, x))


def test_eager_backend_is_layout_flexible(tmp_path: Path) -> None:
    paths = tmp_path / "e.py", tmp_path / "e.cache"
    with precompile.capture(
        convbn_fn,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.MakeFxTracer(),
        backend="eager",
    ) as cap:
        cap(ConvBN().eval(), torch.randn(2, 3, 6, 6))
    model, x = ConvBN().eval(), torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    torch.testing.assert_close(precompile.load(*paths)(model, x), convbn_fn(model, x))


def asserting(x: torch.Tensor) -> torch.Tensor:
    torch._assert_async(x.sum() > 0, "the sum must be positive")
    return x * 2


def test_user_assert_keeps_its_own_message(tmp_path: Path) -> None:
    paths = tmp_path / "a.py", tmp_path / "a.cache"
    with precompile.capture(
        asserting,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.MakeFxTracer(),
        backend="inductor",
    ) as cap:
        cap(torch.ones(3))
    run = precompile.load(*paths)
    torch.testing.assert_close(run(torch.ones(3)), torch.full((3,), 2.0))
    with pytest.raises(Exception, match="the sum must be positive") as info:
        run(-torch.ones(3))
    assert not isinstance(info.value, PrecompileError)


def test_generated_module_is_inlined_and_rewired(convbn: tuple[Path, Path]) -> None:
    text = convbn[0].read_text()
    assert "cpp_fused_" in text and "async_compile.cpp_pybinding(" in text  # kernel sources inline
    assert "from torch._inductor" not in text  # every such import goes through the resolver
    assert "_inductor_import('torch._inductor.async_compile', 'AsyncCompile')" in text
    assert "benchmark_compiled_module" not in text and '__name__ == "__main__"' not in text


#: A child's capture of the MLP with Dynamo and Inductor, and whether it served eager's answer.
_CAPTURE_MLP = """
torch.manual_seed(0)
model, x = MLP().eval(), torch.randn(2, 8)
with precompile.capture(
    mlp_fn, artifact_path={artifact!r}, cache_path={cache!r},
    tracer=precompile.DynamoTracer(), backend="inductor",
) as cap:
    out = cap(model, x)
served = bool(torch.allclose(out, mlp_fn(model, x), atol=1e-5))
"""

_ISA_PROBES = (
    """
import json, os, torch, precompile
from torch._inductor import cpu_vec_isa
from tests.fixtures.models import MLP, mlp_fn

machine = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
probed_in = []
check_build = cpu_vec_isa.VecISA.check_build

def spy(self, code):
    probed_in.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    return check_build(self, code)

cpu_vec_isa.VecISA.check_build = spy
"""
    + _CAPTURE_MLP
    + """
print(json.dumps({{"machine": machine, "probed_in": probed_in, "served": served}}))
"""
)


def test_a_dynamo_capture_asks_the_machines_cache_which_vector_isa_it_builds(
    tmp_path: Path,
) -> None:
    """A Dynamo capture with Inductor compiles into a private cache (its files become the
    artifact's); the machine's vector ISA is asked before it, in the machine's cache,
    where an earlier process left the built probes -- not dry-compiled again (three g++
    runs, seconds each) in every capturing process's empty private cache."""
    seen = run_json(
        _ISA_PROBES.format(artifact=str(tmp_path / "a.py"), cache=str(tmp_path / "a.cache"))
    )
    assert seen["served"]
    assert seen["probed_in"], "the capture never asked which vector ISA this machine builds"
    assert set(seen["probed_in"]) == {seen["machine"]}, seen


_UNWRITABLE_MACHINE_CACHE = (
    """
import json, os, torch, precompile
from torch._inductor import cpu_vec_isa
from tests.fixtures.models import MLP, mlp_fn

valid_vec_isa_list = cpu_vec_isa.valid_vec_isa_list
refused = []
answered = []

def unwritable_outside_the_capture():
    # What Inductor's probe meets in a machine cache it may not write (a non-root user's
    # read-only cache): the write of the probe's source fails, until an answer is
    # remembered (then Inductor reads it from memory, as it does).
    if not answered and "precompile-capture-" not in os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""):
        refused.append(True)
        raise PermissionError(13, "Permission denied", "the machine's Inductor cache")
    answered.append(True)
    return valid_vec_isa_list()

cpu_vec_isa.valid_vec_isa_list = unwritable_outside_the_capture
"""
    + _CAPTURE_MLP
    + """
print(json.dumps({{"refused": len(refused), "served": served}}))
"""
)


def test_a_machine_cache_the_probe_cannot_write_leaves_the_probe_to_the_private_one(
    tmp_path: Path,
) -> None:
    """Where the machine's Inductor cache refuses the probe's files, the capture asks
    inside its private cache, as before: the capture succeeds and serves."""
    seen = run_json(
        _UNWRITABLE_MACHINE_CACHE.format(
            artifact=str(tmp_path / "a.py"), cache=str(tmp_path / "a.cache")
        )
    )
    assert seen == {"refused": 1, "served": True}
