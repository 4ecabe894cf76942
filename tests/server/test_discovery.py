"""Discovery reads targets from source with ast: every import spelling, exact ranges,
code-point columns, and findings (not crashes) for misplaced targets and bad syntax."""

from __future__ import annotations

import textwrap
from pathlib import Path

from precompile_lsp.discovery import discover
from precompile_lsp.findings import Span


def _discover(source: str) -> tuple[list, list]:
    return discover(Path("/ws/m.py"), textwrap.dedent(source), "m")


def test_every_import_spelling() -> None:
    targets, findings = _discover(
        """
        import precompile
        import precompile as pc
        from precompile import target
        from precompile import target as mark
        from precompile.targets import target as deep
        import precompile.targets as pt

        @precompile.target(ex)
        def a(m, x): ...

        @pc.target(ex, backend="eager")
        def b(m, x): ...

        @target(ex)
        def c(m, x): ...

        @mark(ex, tracer="make_fx")
        def d(m, x): ...

        @deep(ex)
        def e(m, x): ...

        @pt.target(ex, artifact="out/e.py")
        def f(m, x): ...

        @other.target(ex)
        def not_a_target(m, x): ...
        """
    )
    assert findings == []
    assert [t.function for t in targets] == ["a", "b", "c", "d", "e", "f"]
    assert targets[1].options["backend"] == "eager" and targets[3].options["tracer"] == "make_fx"
    assert targets[5].options["artifact"] == "out/e.py" and targets[0].key == "m.a"


def test_exact_decorator_and_def_ranges_in_code_points() -> None:
    targets, _ = _discover(
        """
        import precompile
        TEXT = "héllo"
        @precompile.target(ex)  # é
        def classify(model, x):
            return model(x)
        """
    )
    (t,) = targets
    assert t.decorator == Span(4, 0, 4, 22)
    assert t.definition == Span(5, 0, 5, 12)


def test_a_method_and_a_nested_function_are_findings() -> None:
    targets, findings = _discover(
        """
        import precompile as pc

        class Service:
            @pc.target(ex)
            def run(self, m, x): ...

        def outer():
            @pc.target(ex)
            def inner(m, x): ...
        """
    )
    assert targets == []
    assert [(f.code, f.span.line) for f in findings] == [("PC003", 5), ("PC003", 9)]
    assert (
        "method 'run'" in findings[0].message and "nested function 'inner'" in findings[1].message
    )


def test_a_target_without_examples_is_a_finding() -> None:
    targets, findings = _discover(
        """
        import precompile
        @precompile.target
        def f(m, x): ...
        """
    )
    assert targets == [] and findings[0].code == "PC004" and "needs examples" in findings[0].message


def test_a_syntax_error_is_a_finding_in_that_file() -> None:
    targets, findings = _discover("import precompile\ndef broken(:\n    pass\n")
    assert targets == []
    (finding,) = findings
    assert finding.code == "PC002" and finding.span.line == 2 and finding.file == Path("/ws/m.py")


def test_files_without_precompile_are_skipped_cheaply() -> None:
    assert _discover("import torch\ndef f(x): return x\n") == ([], [])
