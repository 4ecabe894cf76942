"""Dicts whose keys Dynamo names by position (Dynamo tracer, eager backend).

Dynamo names every key of a dict subclass by position (``list(dict.keys(D))[i]``): a
library's registry filled as classes are built (``transformers``' ``_CAN_RECORD_REGISTRY``)
holds other keys in another order in another process, and artifacts captured in a
process that built several models could not be loaded where it held fewer ("the guards
... could not be rebuilt in this process: IndexError"). A dict the trace only looked up by
key is now checked by key: served exactly in a process that filled it in another order,
with other keys; the entry it read is still checked (another value, or its key missing,
is refused). A dict whose order the result depends on is refused at load, naming it.
Both guard paths: the Dynamo-free guards and Dynamo's own guard manager.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import registry_dicts as rd
from tests.harness import run_json, run_python

ENTRIES = ("by_key", "by_key_on_device", "finds", "iterates")


def _args(name: str) -> tuple[Any, ...]:
    x = torch.arange(4.0)
    return {"by_key_on_device": (x, torch.device("cpu")), "finds": (x, "b")}.get(name, (x,))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Each entry captured with the registry filled as a, b, c."""
    directory = tmp_path_factory.mktemp("registry")
    torch._logging.set_logs(dynamo=logging.ERROR)
    rd.fill(["a", "b", "c"])
    paths = {}
    try:
        for name in ENTRIES:
            torch._dynamo.reset()
            pair = str(directory / f"{name}.py"), str(directory / f"{name}.cache")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with precompile.capture(
                    getattr(rd, name),
                    artifact_path=pair[0],
                    cache_path=pair[1],
                    tracer=precompile.DynamoTracer(),
                    backend="eager",
                ) as cap:
                    cap(*_args(name))
            paths[name] = pair
    finally:
        rd.fill([])
    return paths


SERVE = """
import json, sys, warnings
import torch
import precompile
from tests.fixtures import registry_dicts as rd
from tests.core._compat.test_dynamo_dict_keys import _args
warnings.simplefilter("ignore")
paths = {paths!r}
results = {{}}
for label, order, scales in {fills!r}:
    rd.fill(order, scales)
    results[label] = {{}}
    for name, (artifact, cache) in paths.items():
        args = _args(name)
        try:
            served = precompile.load(artifact, cache)(*args)
            results[label][name] = bool(torch.equal(served, getattr(rd, name)(*args)))
        except precompile.PrecompileError as error:
            results[label][name] = str(error)
print(json.dumps({{"results": results, "dynamo": "torch._dynamo" in sys.modules}}))
"""


def _serve(paths: dict[str, tuple[str, str]], fills: list[Any]) -> dict[str, Any]:
    return dict(run_json(SERVE.format(paths=paths, fills=fills)))


@pytest.fixture(scope="module")
def served(artifacts: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """One fresh process, the registry filled several ways in turn."""
    fills = [
        ("as captured", ["a", "b", "c"], None),
        ("reordered, more keys", ["f", "c", "e", "b", "a", "d"], None),
        ("only b", ["b"], None),
        ("b missing", ["c", "a"], None),
        ("b changed", ["c", "b", "a"], {"b": 5.0}),
        ("same order, more keys", ["a", "b", "c", "d"], None),
    ]
    return dict(_serve(artifacts, fills)["results"])


def test_both_guard_paths_are_exercised(artifacts: dict[str, tuple[str, str]]) -> None:
    paths = {
        n: precompile.inspect_artifact(a)["GUARD_RUNTIME"]["path"]
        for n, (a, _c) in artifacts.items()
    }
    assert paths["by_key"] == paths["by_key_on_device"] == "dynamo", paths
    assert paths["finds"] == paths["iterates"] == "plain", paths


@pytest.mark.parametrize("fill", ["as captured", "reordered, more keys", "only b"])
@pytest.mark.parametrize("entry", ["by_key", "by_key_on_device", "finds"])
def test_a_registry_looked_up_by_key_serves_in_any_order(
    served: dict[str, Any], fill: str, entry: str
) -> None:
    """Before: "could not be rebuilt in this process: IndexError" ("only b"), or the
    positional guards failing every call (another order)."""
    assert served[fill][entry] is True, served[fill][entry]


@pytest.mark.parametrize("entry", ["by_key", "by_key_on_device", "finds"])
def test_the_entry_read_is_still_checked_by_key(served: dict[str, Any], entry: str) -> None:
    """The key the trace read must be there (``finds`` answered ``'b' in REGISTRY`` with
    True); ``b``'s value must be what the trace read."""
    missing = served["b missing"][entry]
    assert isinstance(missing, str) and "___dict_contains('b', REGISTRY)" in missing, missing
    if entry != "finds":  # finds does not read b's value
        changed = served["b changed"][entry]
        assert isinstance(changed, str) and "REGISTRY" in changed, changed
    else:
        assert served["b changed"][entry] is True


def test_a_registry_whose_order_matters_is_refused_naming_it(served: dict[str, Any]) -> None:
    """``iterates``' result depends on the registry's order: served as captured, and
    refused (never served with the captured order's answer) otherwise; at load, naming the
    dict and the fix, where it holds other keys at the positions the guards read."""
    assert served["as captured"]["iterates"] is True
    for fill in ("reordered, more keys", "only b", "b missing"):
        message = served[fill]["iterates"]
        assert isinstance(message, str), (fill, message)
        assert "dict `REGISTRY`" in message and "tests.fixtures.registry_dicts" in message
        assert "the trace iterated it" in message
        assert "Fill it in the order the capture saw" in message
        assert "IndexError" not in message and "list(dict.keys" not in message
    # The captured keys where the guards read them, one more after: the guards refuse.
    assert isinstance(served["same order, more keys"]["iterates"], str)


def test_transformers_models_captured_together_serve_alone(tmp_path: Path) -> None:
    """BERT then GPT-2 captured in one process (as a warm worker does): GPT-2's artifact
    reads ``_CAN_RECORD_REGISTRY``'s second key, and serves exactly in a fresh process
    that builds GPT-2 alone (and one that builds GPT-2 before BERT)."""
    script = f"""
import json, logging, warnings, torch, precompile
from tests.fixtures import registry_dicts as rd
torch._logging.set_logs(dynamo=logging.ERROR)
warnings.simplefilter("ignore")
ids = torch.randint(0, 32, (1, 5), generator=torch.Generator().manual_seed(0))
for kind in ("bert", "gpt2"):
    torch._dynamo.reset()
    model = rd.build_transformer(kind)
    with torch.no_grad(), precompile.capture(
        rd.last_hidden,
        artifact_path={str(tmp_path)!r} + f"/{{kind}}.py",
        cache_path={str(tmp_path)!r} + f"/{{kind}}.cache",
        tracer=precompile.DynamoTracer(),
        backend="eager",
    ) as cap:
        cap(model, ids)
from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
print(json.dumps(list(_CAN_RECORD_REGISTRY)))
"""
    registry = run_json(script, timeout=600, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    assert [k.rsplit(".", 1)[-1] for k in registry] == ["BertModel'>", "GPT2Model'>"]
    assert "_CAN_RECORD_REGISTRY))[1]" in (tmp_path / "gpt2.py").read_text()
    for kinds in (["gpt2"], ["gpt2", "bert"]):
        serve = f"""
import json, warnings, torch, precompile
from tests.fixtures import registry_dicts as rd
warnings.simplefilter("ignore")
models = {{kind: rd.build_transformer(kind) for kind in {kinds!r}}}
run = precompile.load({str(tmp_path / "gpt2.py")!r}, {str(tmp_path / "gpt2.cache")!r})
ids = torch.randint(0, 32, (1, 5), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    print(json.dumps(bool(torch.equal(run(models["gpt2"], ids), rd.last_hidden(models["gpt2"], ids)))))
"""
        proc = run_python(serve, timeout=600, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        assert proc.returncode == 0, (kinds, proc.stderr[-3000:])
        assert proc.stdout.strip().splitlines()[-1] == "true", kinds
