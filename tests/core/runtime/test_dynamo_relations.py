"""Relations between access paths from fn's arguments (Dynamo tracer, eager backend).

An object the trace compared by identity that no other process can name -- a config
that ``copy.deepcopy`` keys by ``id``, one Dynamo found at two paths
(``model.decoder.config`` is ``model.config``) -- told the trace only which of those
paths held one object. The artifact checks exactly that per call: ``transformers``' T5,
BART and Whisper are captured and served in a fresh process in parity with eager, and a
call where the relation no longer holds is refused naming both paths. A ``with
torch.no_grad():`` block carried across a graph break is served too.
"""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import relation_models as rm
from tests.harness import run_json, together

#: What a message in the user's words never holds.
RAW = ("L['", "G['", "___", "_modules[", "0x", "__dict__")


@pytest.fixture(autouse=True)
def _quiet_dynamo() -> None:
    torch._logging.set_logs(dynamo=logging.ERROR)


def _capture(directory: Path, entry: str, kind: str, *more: tuple[Any, ...]) -> tuple[str, str]:
    """Capture ``entry`` on a fresh ``kind`` model (one call, and one per ``more``)."""
    torch._dynamo.reset()
    model, args = rm.build(kind, seed=0)
    paths = str(directory / f"{entry}.py"), str(directory / f"{entry}.cache")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with precompile.capture(
            getattr(rm, entry),
            artifact_path=paths[0],
            cache_path=paths[1],
            tracer=precompile.DynamoTracer(),
            backend="eager",
        ) as cap:
            cap(model, *args)
            for extra in more:
                cap(model, *extra)
    return paths


def _serve(paths: tuple[str, str], entry: str, kind: str, cells: dict[str, str]) -> Any:
    script = f"""
import json
from tests.fixtures import relation_models as rm
print(json.dumps(rm.serve_cells({paths[0]!r}, {paths[1]!r}, {entry!r}, {kind!r}, {cells!r})))
"""
    return run_json(script, timeout=600, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


@pytest.fixture(scope="module")
def encoder_decoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """T5, BART and Whisper, captured one after another in this process (as a warm worker
    captures several targets: ``transformers``' registry of model classes,
    ``_CAN_RECORD_REGISTRY``, then holds all three, and Dynamo's guards name its keys by
    position), each served in a fresh process that builds only that model: as captured
    (twice), and with the decoder given a copy of the config."""
    directory = tmp_path_factory.mktemp("encoder-decoders")
    cells = {"baseline": "", "copied_config": "copied_config", "baseline_again": ""}
    captured = {entry: _capture(directory, entry, kind) for entry, kind in rm.ENTRIES.items()}
    served = together(
        *(
            lambda entry=entry, kind=kind: _serve(captured[entry], entry, kind, cells)
            for entry, kind in rm.ENTRIES.items()
        )
    )
    return dict(zip(rm.ENTRIES, served))


@pytest.mark.parametrize("entry", list(rm.ENTRIES))
def test_an_encoder_decoder_sharing_its_config_serves_like_eager(
    encoder_decoders: dict[str, Any], entry: str
) -> None:
    """Refused at capture before ("`model.config` holds a BartConfig object, which the
    trace compared by identity ... no other process can name that object")."""
    results = encoder_decoders[entry]
    assert results["baseline"] == {"result": "exact", "message": ""}, results
    assert results["baseline_again"] == {"result": "exact", "message": ""}, results


@pytest.mark.parametrize("entry", list(rm.ENTRIES))
def test_a_decoder_given_a_copy_of_the_config_is_refused_naming_both_paths(
    encoder_decoders: dict[str, Any], entry: str
) -> None:
    results = encoder_decoders[entry]
    cell = results["copied_config"]
    assert cell["result"] == "refused", results
    message = cell["message"]
    assert "`model.decoder.config`" in message, message
    assert re.search(
        r"`model[\w.]*` and `model[\w.]*` are two different objects in this call", message
    ), message
    assert "at capture they were one object" in message, message
    assert "re-emit the artifact" in message, message
    for raw in RAW:
        assert raw not in message, message


@pytest.mark.parametrize(
    ("captured_as", "cells", "named"),
    [
        # Captured with the child sharing the holder's config; a copy breaks that.
        ("shared", {"copied": "copied_cfg"}, "two different objects"),
        # Captured with two configs; making them one is refused the other way round.
        ("distinct", {"shared": "shared_cfg"}, "one object"),
    ],
)
def test_an_is_test_between_two_argument_paths_is_checked_both_ways(
    tmp_path: Path, captured_as: str, cells: dict[str, str], named: str
) -> None:
    """``self.child.cfg is self.cfg`` in plain code: served as captured, and a call where
    the two paths are grouped otherwise -- which changes eager's answer -- is refused
    naming both paths."""
    paths = _capture(tmp_path, "holder_step", captured_as)
    results = _serve(paths, "holder_step", captured_as, {"baseline": "", **cells})
    assert results["baseline"]["result"] == "exact", results
    (cell,) = cells
    assert results[cell]["result"] == "refused", results
    message = results[cell]["message"]
    assert "`model.child.cfg`" in message and "`model.cfg`" in message, message
    assert f"are {named} in this call" in message, message
    for raw in RAW:
        assert raw not in message, message


def test_an_unnamed_config_read_by_identity_in_two_captured_groupings_is_refused(
    tmp_path: Path,
) -> None:
    """One artifact serves one grouping: a capture whose calls grouped the paths
    differently is refused at capture, naming both paths."""
    torch._dynamo.reset()
    shared, (x,) = rm.build("shared", seed=0)
    distinct, _ = rm.build("distinct", seed=0)
    with pytest.raises(precompile.PrecompileError) as info:
        with precompile.capture(
            rm.holder_step,
            artifact_path=str(tmp_path / "a.py"),
            cache_path=str(tmp_path / "a.cache"),
            tracer=precompile.DynamoTracer(),
            backend="eager",
        ) as cap:
            cap(shared, x)
            cap(distinct, x)
    message = str(info.value)
    assert "`model.child.cfg` and `model.cfg`" in message or (
        "`model.cfg` and `model.child.cfg`" in message
    ), message
    assert "one artifact serves one such grouping" in message, message


def test_a_no_grad_block_carried_across_a_graph_break_serves_like_eager(tmp_path: Path) -> None:
    """Dynamo re-enters the ``with`` block in the continuation with the context manager
    class it carries (``set_grad_enabled``); that was refused at capture as an object
    compared by identity that is not one of fn's parameters. Both branches serve in a
    fresh process exactly."""
    model, (x,) = rm.build("no_grad", seed=0)
    torch._dynamo.reset()
    paths = _capture(tmp_path, "no_grad_branch_step", "no_grad", (-x,))
    results = _serve(
        paths, "no_grad_branch_step", "no_grad", {"positive": "", "negative": "negated"}
    )
    assert results == {
        "positive": {"result": "exact", "message": ""},
        "negative": {"result": "exact", "message": ""},
    }, results
    # The artifact checks that the class it re-enters is still torch's.
    text = Path(paths[0]).read_text()
    assert "'scope': 'torch.autograd.grad_mode'" in text


# ---------------------------------------------------------------- refusals in the product's words


def _words_capture(tmp_path: Path, tracer: Any) -> tuple[str, str]:
    from tests.fixtures import words_entry, words_models

    torch._dynamo.reset()
    torch.manual_seed(0)
    paths = str(tmp_path / "words.py"), str(tmp_path / "words.cache")
    with precompile.capture(
        words_entry.step,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=tracer,
        backend="eager",
    ) as cap:
        cap(words_models.Net(), torch.randn(2, 4))
    return paths


def _words_refusal(paths: tuple[str, str], change: str) -> str:
    """The refusal a fresh process gets after ``change`` (Python run after load)."""
    script = f"""
import json, types, warnings, torch, precompile
warnings.simplefilter("ignore")
from tests.fixtures import words_models as wm
model = wm.Net()
run = precompile.load({paths[0]!r}, {paths[1]!r})
run(model, torch.randn(2, 4))
{change}
try:
    run(model, torch.randn(2, 4))
    print(json.dumps("SERVED"))
except precompile.PrecompileError as error:
    print(json.dumps(str(error).replace(chr(10), " ")))
"""
    return str(run_json(script))


def test_a_read_in_the_users_module_is_named_where_the_users_code_reached_it(
    tmp_path: Path,
) -> None:
    """Dynamo meets ``torch.nn.functional`` first as ``torch.nn.modules.linear.F`` and
    names the user's ``F.gelu`` through it: the artifact records the read as the user's
    module reached it (``words_models.F.gelu``), and rebinding the user's ``F`` is refused
    naming that global, not as ``torch.nn.modules.linear.F.gelu``."""
    paths = _words_capture(tmp_path, precompile.DynamoTracer())
    metadata = precompile.inspect_artifact(paths[0])
    shown = {r.get("shown") for r in metadata["GLOBAL_READS"]}
    assert "tests.fixtures.words_models.F.gelu" in shown, metadata["GLOBAL_READS"]
    # A module's own dicts (`_modules`, `_parameters`) are checked with its structure:
    # a plain model has no relation to check per call.
    assert metadata["ARG_RELATIONS"] == [], metadata["ARG_RELATIONS"]
    message = _words_refusal(
        paths, "wm.F = types.SimpleNamespace(gelu=lambda t: t, linear=wm.F.linear)"
    )
    assert "`tests.fixtures.words_models.F`" in message, message
    assert "are two different objects" in message, message
    assert "torch.nn.modules.linear.F.gelu" not in message, message
    assert " is tests.fixtures" not in message, message  # the raw `a is b`


def test_a_replaced_registry_function_is_said_as_a_replaced_function(tmp_path: Path) -> None:
    """A guard on a registered kernel's ``__defaults__`` (transformers' attention registry
    after ``AttentionInterface.register('sdpa', kernel)``) fails as "`...['sdpa']
    .__defaults__` is not a tuple"; it is said as the function there being replaced."""
    from precompile.runtime.guard_text import guard_failure_text

    raw = (
        "___check_type_id(dict(type(G['__import_transformers_dot_models_dot_bart_dot_"
        "modeling_bart'].ALL_ATTENTION_FUNCTIONS).__dict__)['_global_mapping']['sdpa']"
        ".__defaults__, 94), type=<class 'tuple'>  # x  # modeling_bart.py:243 in forward"
    )
    said = guard_failure_text(raw)
    assert said.startswith(
        "`transformers.models.bart.modeling_bart.ALL_ATTENTION_FUNCTIONS._global_mapping"
        "['sdpa']` is not the function the capture traced"
    ), said
    assert "was replaced" in said and "re-emit the artifact" in said, said
    assert "is not a tuple" not in said and "dict(type(" not in said, said


def test_make_fx_global_checks_name_the_module_file_as_imported(tmp_path: Path) -> None:
    """A make_fx artifact's check of a module-level value names the module's file as this
    process imported it (absolute, like every other message), not relative to the
    directory the artifact was written in (``../../...``)."""
    import os

    from tests.fixtures import words_models

    paths = _words_capture(tmp_path, precompile.MakeFxTracer())
    message = _words_refusal(paths, "wm.SCALE = 3.0")
    assert f"({os.path.abspath(words_models.__file__)})" in message, message
    assert "../" not in message, message
