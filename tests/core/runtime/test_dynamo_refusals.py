"""What a Dynamo artifact refuses, each with its message: foreign torch or Python, a
rebound global, a __main__ or closure entry, a resume name held by something else, two
artifacts of one function, and a function whose source changed since capture."""

from __future__ import annotations

import logging
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from precompile import PrecompileError
from tests.fixtures import dynamo_models
from tests.fixtures.models import MLP
from tests.harness import run_python


@pytest.fixture(autouse=True)
def _quiet_dynamo() -> None:
    torch._logging.set_logs(dynamo=logging.ERROR)


def _capture(fn: Any, directory: Path, name: str, *calls: tuple[Any, ...]) -> tuple[Path, Path]:
    torch._dynamo.reset()
    paths = directory / f"{name}.py", directory / f"{name}.cache"
    with precompile.capture(
        fn,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.DynamoTracer(dynamic=False),
        backend="eager",
    ) as cap:
        for args in calls:
            cap(*args)
    return paths


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    torch._logging.set_logs(dynamo=logging.ERROR)
    return _capture(
        dynamo_models.explicit_break,
        tmp_path_factory.mktemp("explicit"),
        "explicit",
        (MLP().eval(), torch.randn(2, 8)),
    )


def _doctor(paths: tuple[Path, Path], tmp_path: Path, old: str, new: str) -> Path:
    text = paths[0].read_text()
    assert old in text
    out = tmp_path / "doctored.py"
    out.write_text(text.replace(old, new, 1))
    return out


def test_foreign_torch_version_is_refused_before_unpickling(
    explicit: tuple[Path, Path], tmp_path: Path
) -> None:
    doctored = _doctor(
        explicit,
        tmp_path,
        f"TORCH_VERSION = {str(torch.__version__)!r}",
        "TORCH_VERSION = '2.99.0'",
    )
    with pytest.raises(
        PrecompileError, match=r"captured with torch 2\.99\.0 and cannot load on torch"
    ):
        precompile.load(doctored)


def test_foreign_python_version_is_refused(explicit: tuple[Path, Path], tmp_path: Path) -> None:
    here = f"PYTHON_VERSION = [{sys.version_info[0]}, {sys.version_info[1]}]"
    doctored = _doctor(explicit, tmp_path, here, "PYTHON_VERSION = [3, 99]")
    with pytest.raises(
        PrecompileError, match=r"captured on Python 3\.99 .*serialized code objects"
    ):
        precompile.load(doctored)


def test_rebound_global_fails_its_guard(tmp_path: Path) -> None:
    paths = _capture(
        dynamo_models.global_scaled, tmp_path, "scaled", (MLP().eval(), torch.randn(2, 8))
    )
    run = precompile.load(*paths)
    model, x = MLP().eval(), torch.randn(2, 8)
    torch.testing.assert_close(run(model, x), dynamo_models.global_scaled(model, x))
    dynamo_models.SCALE = 3.0
    try:
        with pytest.raises(PrecompileError) as info:
            run(model, x)
        assert "global_scaled" in str(info.value) and "SCALE" in str(info.value)
    finally:
        dynamo_models.SCALE = 2.0
    torch.testing.assert_close(run(model, x), dynamo_models.global_scaled(model, x))


def test_capture_from_main_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import torch, precompile
            def fn(x):
                return x * 2
            try:
                with precompile.capture(fn, artifact_path={str(tmp_path / 'a.py')!r}, cache_path={str(tmp_path / 'a.cache')!r}, backend="eager") as cap:
                    cap(torch.ones(2))
            except precompile.PrecompileError as error:
                print("REFUSED:", error)
            """
        )
    )
    proc = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert proc.returncode == 0, proc.stderr
    assert (
        "REFUSED:" in proc.stdout
        and "__main__" in proc.stdout
        and "importable module" in proc.stdout
    )
    assert not (tmp_path / "a.py").exists()


def test_closure_entry_is_refused(tmp_path: Path) -> None:
    scale = 2.0

    def closure(x: torch.Tensor) -> torch.Tensor:
        return x * scale

    with pytest.raises(PrecompileError, match=r"not reachable as|closes over") as info:
        with precompile.capture(
            closure,
            artifact_path=tmp_path / "a.py",
            cache_path=tmp_path / "a.cache",
            backend="eager",
        ) as cap:
            cap(torch.ones(2))
    assert (
        info.value.location is not None
        and info.value.location.line == closure.__code__.co_firstlineno
    )


def test_a_resume_name_held_by_something_else_is_refused(explicit: tuple[Path, Path]) -> None:
    meta = precompile.inspect_artifact(explicit[0])
    name = next(f for f in meta["FRAMES"] if not f["entry"])["resume_names"][0]
    setattr(dynamo_models, name, lambda *a: None)  # e.g. a user binding or a live compile
    try:
        with pytest.raises(PrecompileError, match="load the artifact in a fresh process"):
            precompile.load(*explicit)
    finally:
        delattr(dynamo_models, name)


def test_same_artifact_twice_and_two_artifacts_of_one_function_serve_side_by_side(
    explicit: tuple[Path, Path], tmp_path: Path
) -> None:
    # Names are tagged with each artifact's content hash, so two artifacts of one function
    # bind disjoint names and both serve (upstream refuses this; we need not).
    first = precompile.load(*explicit)
    second = precompile.load(*explicit)  # a rebuild of the same artifact is fine
    other = precompile.load(
        *_capture(
            dynamo_models.explicit_break, tmp_path, "other", (MLP().eval(), torch.randn(3, 8))
        )
    )
    model = MLP().eval()
    x2, x3 = torch.randn(2, 8), torch.randn(3, 8)
    torch.testing.assert_close(second(model, x2), dynamo_models.explicit_break(model, x2))
    torch.testing.assert_close(other(model, x3), dynamo_models.explicit_break(model, x3))
    with pytest.raises(PrecompileError, match="`x` has size 3 at dim 0; the capture saw 2"):
        first(model, x3)
    with pytest.raises(PrecompileError, match="`x` has size 2 at dim 0; the capture saw 3"):
        other(model, x2)
    for run in (first, second, other):
        run.unload()
        run.unload()  # idempotent
    tags = {run.metadata["ARTIFACT_TAG"] for run in (first, other)}
    assert len(tags) == 2
    left = [n for n in vars(dynamo_models) if any(n.endswith(tag) for tag in tags)]
    assert left == [], left


def test_changed_source_is_refused_naming_file_and_function(tmp_path: Path) -> None:
    package = tmp_path / "userpkg"
    package.mkdir()
    module = package / "changing.py"
    module.write_text(
        textwrap.dedent(
            """
            import torch

            def target(x):
                y = x + 1
                torch._dynamo.graph_break()
                return y * 2
            """
        )
    )
    capture = f"""
import sys, torch, precompile
sys.path.insert(0, {str(tmp_path)!r})
from userpkg.changing import target
with precompile.capture(target, artifact_path={str(tmp_path / 't.py')!r}, cache_path={str(tmp_path / 't.cache')!r}, backend="eager") as cap:
    cap(torch.ones(3))
"""
    proc = run_python(capture)
    assert proc.returncode == 0, proc.stderr
    load = f"""
import sys, torch, precompile, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {str(tmp_path)!r})
try:
    run = precompile.load({str(tmp_path / 't.py')!r}, {str(tmp_path / 't.cache')!r})
    print("LOADED", run(torch.ones(3)).tolist())
except precompile.PrecompileError as error:
    print("REFUSED:", error)
"""
    proc = run_python(load)
    assert "LOADED [4.0, 4.0, 4.0]" in proc.stdout, proc.stdout + proc.stderr
    # An edit elsewhere in the module (its digest differs, the function's does not).
    module.write_text(module.read_text() + "\n# a comment added after capture\n")
    shutil.rmtree(package / "__pycache__", ignore_errors=True)
    proc = run_python(load)
    assert "LOADED [4.0, 4.0, 4.0]" in proc.stdout, proc.stdout + proc.stderr
    module.write_text(module.read_text().replace("y * 2", "y * 3"))
    shutil.rmtree(package / "__pycache__", ignore_errors=True)
    proc = run_python(load)
    assert "REFUSED:" in proc.stdout, proc.stdout + proc.stderr
    assert (
        "target" in proc.stdout and "changing.py" in proc.stdout and "changed since" in proc.stdout
    )


def test_a_loaded_artifact_leaves_live_compiles_in_its_module_working(
    explicit: tuple[Path, Path],
) -> None:
    # The artifact binds only names tagged with its content hash, so Dynamo, minting its
    # own counter-based names in the same module, finds none of them taken.
    run = precompile.load(*explicit)
    torch._dynamo.reset()
    model, x = MLP().eval(), torch.randn(2, 8)
    compiled = torch.compile(dynamo_models.explicit_break, backend="eager")
    torch.testing.assert_close(compiled(model, x), dynamo_models.explicit_break(model, x))
    torch.testing.assert_close(run(model, x), dynamo_models.explicit_break(model, x))
    run.unload()
