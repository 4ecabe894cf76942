"""Issue 26, round 4 (class C): a function object the trace ran that outlives the call,
held only where no recorded path or fingerprint reaches -- the result an lru_cache'd
maker returned (the cache is C state), a ``weakref.WeakValueDictionary`` entry (a weak
reference). Eager calls that very object on every call: its ``__code__`` swapped, or the
cache cleared and its maker changed, or the entry replaced, was served stale. Such a
function is refused at capture, naming it and what holds it
(``precompile.capturing.live_functions``), by both tracers.

The same function bound to a module-level name the traced code reads, and a cached
helper that returns a plain value (make_fx watches an lru_cache by its wrapped
function), are served equal to eager in a fresh process, and a change to either after
serving is refused.
"""

from __future__ import annotations

import functools
import sys
import textwrap
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.harness import attack_in_child, capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


# Each holder gets a maker of its own: the rule is by code, and a function of the same
# code watched elsewhere would watch this one's code too (``live_functions``).
def make_cached(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def act(x: torch.Tensor) -> torch.Tensor:
        return x * k

    return act


def make_bounded(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def act(x: torch.Tensor) -> torch.Tensor:
        return x * k - 1

    return act


def make_weak(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def act(x: torch.Tensor) -> torch.Tensor:
        return x * k + 2

    return act


def make_bound(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def act(x: torch.Tensor) -> torch.Tensor:
        return x * k + 3

    return act


def make_other(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    # What a hot patch swaps in: the same free variable, another body.
    def act(x: torch.Tensor) -> torch.Tensor:
        return x + k

    return act


def tripled(k: float) -> float:
    return k * 3.0


@functools.cache
def cached_act(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return make_cached(k)


@functools.lru_cache(maxsize=8)
def bounded_act(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return make_bounded(k)


@functools.lru_cache
def scale_for(k: float) -> float:
    return k * 2.0


_KEEP: list[Any] = []
WEAK: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
#: The same kind of function, bound to a module-level name: served, and watched.
ACT = make_bound(2.0)


def _fill() -> None:
    cached_act.cache_clear()
    bounded_act.cache_clear()
    _KEEP[:] = [make_weak(2.0)]
    WEAK["act"] = _KEEP[0]


class UsesCache(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cached_act(2.0)(x) + 1


class UsesLruCache(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bounded_act(2.0)(x) + 1


class UsesWeak(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return WEAK["act"](x) + 1


class UsesBound(nn.Module):
    """The served shapes: a module-level function, a cached helper returning a value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ACT(x) * scale_for(1.5)


def make_shared(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def act(x: torch.Tensor) -> torch.Tensor:
        return x * k + 5

    return act


#: A function of make_shared's code bound to a module-level name: a code is watched by
#: any one of its functions, except the ones an lru_cache holds (each is compared).
SHARED = make_shared(4.0)


@functools.cache
def cached_shared(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return make_shared(k)


class UsesCachedShared(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cached_shared(2.0)(x) + 1


class UsesSharedAndCached(nn.Module):
    """Reads SHARED too: make_fx then watches SHARED, which runs the cached one's code."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return SHARED(x) + cached_shared(2.0)(x)


#: One factory's function in a registry the trace reads, besides SHARED.
REGISTRY_SHARED = {"a": make_shared(3.0)}


class UsesRegistryShared(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return REGISTRY_SHARED["a"](x) + 1


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


#: case -> (model, words the refusal must hold besides the function's name), per tracer
#: refusing it (Dynamo breaks the graph at the WeakValueDictionary and refuses the
#: function carried across the break, by its name; make_fx fingerprints a weak
#: dictionary by what its entries refer to, so it serves and watches that function:
#: test_a_function_a_weak_dictionary_holds_is_served_and_watched_by_make_fx).
REFUSED: dict[str, tuple[type[nn.Module], dict[str, str]]] = {
    "functools.cache": (
        UsesCache,
        {"make_fx": "the lru_cache of cached_act", "dynamo": "the lru_cache of cached_act"},
    ),
    "functools.lru_cache": (
        UsesLruCache,
        {"make_fx": "the lru_cache of bounded_act", "dynamo": "the lru_cache of bounded_act"},
    ),
    "WeakValueDictionary": (
        UsesWeak,
        {"dynamo": "make_weak.<locals>.act"},
    ),
}


@pytest.mark.parametrize(
    ("case", "tracer"), [(case, tracer) for case in sorted(REFUSED) for tracer in REFUSED[case][1]]
)
def test_a_function_only_c_state_holds_is_refused_at_capture(
    tracer: str, case: str, tmp_path: Path
) -> None:
    model, words = REFUSED[case]
    _fill()
    torch.manual_seed(0)
    with torch.no_grad(), pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(
            serve, model().eval(), torch.randn(3, 4), directory=tmp_path, tracer=TRACERS[tracer]()
        )
    text = str(refused.value)
    assert ".<locals>.act" in text and words[tracer] in text, text


CHILD = """
import json, warnings
warnings.simplefilter("ignore")
import torch, precompile
from tests.core.runtime import test_unwatched_functions as case
from tests.harness import served_or_refused

def outcome(run, model, x):
    return served_or_refused(lambda: run(model, x), lambda: case.serve(model, x))

run = precompile.load({artifact!r}, {cache!r})
torch.manual_seed(0)
model, x = case.UsesBound().eval(), torch.randn(3, 4)
out = {{}}
with torch.no_grad():
    out["first"] = [outcome(run, model, x) for _ in range(2)]
    code = case.ACT.__code__
    case.ACT.__code__ = case.make_other(0.0).__code__
    out["code swapped"] = outcome(run, model, x)
    case.ACT.__code__ = code
    out["undone"] = outcome(run, model, x)
    case.scale_for.cache_clear()
    case.scale_for.__wrapped__.__code__ = case.tripled.__code__
    out["cached maker changed"] = outcome(run, model, x)
print(json.dumps(out))
"""


def _served_and_watched(
    child: str, model: type[nn.Module], tracer: str, directory: Path, refused: dict[str, str]
) -> None:
    """Capture ``model`` with ``tracer`` and run ``child`` on it in a fresh process: its
    first two calls and the one after the undo served equal to eager, each cell of
    ``refused`` refused naming its words."""
    out = attack_in_child(
        child,
        serve,
        lambda: model().eval(),
        lambda: torch.randn(3, 4),
        directory=directory,
        tracer=TRACERS[tracer](),
    )
    assert out["first"] == [["served", True]] * 2, out
    assert out["undone"] == ["served", True], out
    for cell, words in refused.items():
        kind, text = out[cell]
        assert kind == "refused" and words in text, (cell, out)


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_the_same_function_bound_to_a_name_is_served_and_watched(
    tracer: str, tmp_path: Path
) -> None:
    scale_for.cache_clear()
    refused = {"code swapped": "ACT", "cached maker changed": "scale_for"}
    _served_and_watched(CHILD, UsesBound, tracer, tmp_path, refused)


WEAK_CHILD = """
import json, warnings
warnings.simplefilter("ignore")
import torch, precompile
from tests.core.runtime import test_unwatched_functions as case
from tests.harness import served_or_refused

case._fill()
run = precompile.load({artifact!r}, {cache!r})
torch.manual_seed(0)
model, x = case.UsesWeak().eval(), torch.randn(3, 4)
out = {{}}
with torch.no_grad():
    check = lambda: served_or_refused(lambda: run(model, x), lambda: case.serve(model, x))
    out["first"] = [check() for _ in range(2)]
    held = case.WEAK["act"]
    code = held.__code__
    held.__code__ = case.make_other(0.0).__code__
    out["code swapped"] = check()
    held.__code__ = code
    out["undone"] = check()
    case._KEEP[:] = [case.make_weak(5.0)]  # the old entry dies, a new one replaces it
    case.WEAK["act"] = case._KEEP[0]
    out["entry replaced"] = check()
print(json.dumps(out))
"""


def test_a_function_a_weak_dictionary_holds_is_served_and_watched_by_make_fx(
    tmp_path: Path,
) -> None:
    """make_fx fingerprints a WeakValueDictionary by what its entries refer to (a weak
    reference by its referent), so the function an entry holds is watched like one a
    module-level name holds: served equal to eager, and its ``__code__`` swapped or the
    entry replaced by another function is refused."""
    _fill()
    refused = {"code swapped": "WEAK", "entry replaced": "WEAK"}
    _served_and_watched(WEAK_CHILD, UsesWeak, "make_fx", tmp_path, refused)


FROZEN = """
import gc, json, warnings
warnings.simplefilter("ignore")
import torch, precompile
from tests.core.runtime import test_unwatched_functions as case
from tests.harness import capture_pair

case._fill()
torch.manual_seed(0)
model, x = case.{model}().eval(), torch.randn(3, 4)
gc.freeze()  # what a pre-forking server does once it has imported everything
try:
    with torch.no_grad():
        capture_pair(case.serve, model, x, directory=__import__("pathlib").Path({directory!r}),
                     tracer=precompile.{tracer}())
    words = None
except precompile.PrecompileError as error:
    words = str(error)
print(json.dumps({{"refused": words, "still_frozen": gc.get_freeze_count() > 0}}))
"""


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_frozen_heap_is_walked_too(tracer: str, tmp_path: Path) -> None:
    """After ``gc.freeze()`` CPython's ``gc.get_referrers`` sees none of the frozen
    objects: the walk that finds an lru_cache'd function found nothing, and the capture
    went through (its ``__code__`` swapped later would be served stale). Walked with the
    heap unfrozen, the capture refuses it as in an unfrozen process, and the heap is
    frozen again after."""
    names = {"make_fx": "MakeFxTracer", "dynamo": "DynamoTracer"}
    got = run_json(
        textwrap.dedent(
            FROZEN.format(model="UsesCache", tracer=names[tracer], directory=str(tmp_path))
        )
    )
    assert got["refused"] and "the lru_cache of cached_act" in got["refused"], got
    assert got["still_frozen"], got


SHARED_CHILD = """
import json, warnings
warnings.simplefilter("ignore")
import torch, precompile
from tests.core.runtime import test_unwatched_functions as case
from tests.harness import served_or_refused

run = precompile.load({artifact!r}, {cache!r})
torch.manual_seed(0)
model, x = case.UsesRegistryShared().eval(), torch.randn(3, 4)
out = {{}}
with torch.no_grad():
    out["first"] = served_or_refused(lambda: run(model, x), lambda: case.serve(model, x))
    case.REGISTRY_SHARED["a"].__code__ = case.make_other(0.0).__code__
    out["entry's code swapped"] = served_or_refused(
        lambda: run(model, x), lambda: case.serve(model, x)
    )
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    "warm", ["cold", "warm", "another argument, named"], ids=lambda w: f"{w} cache"
)
@pytest.mark.parametrize("model", [UsesCachedShared, UsesSharedAndCached])
@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_cached_function_sharing_its_code_with_a_named_one_is_refused(
    tracer: str, model: type[nn.Module], warm: str, tmp_path: Path, monkeypatch: Any
) -> None:
    """The function an lru_cache holds is what eager calls next time; ``SHARED``, a
    module-level function the same factory made, runs the same code. Watching a code
    by any one of its functions let Dynamo serve a swap of the cached function's
    ``__code__`` stale (and make_fx too, where the trace also read ``SHARED``): the
    cache's functions are compared by identity, and Dynamo's empty cache (it traced the
    maker as uncached), or one that holds a watched function for other arguments, is
    refused too."""
    cached_shared.cache_clear()
    if warm == "warm":
        cached_shared(2.0)
    if warm == "another argument, named":
        # The cache holds only a watched function, made for other arguments: Dynamo
        # served the call's own (2.0) stale, which eager makes and caches next call.
        monkeypatch.setattr(sys.modules[__name__], "SHARED_FIVE", cached_shared(5.0), raising=False)
    torch.manual_seed(0)
    with torch.no_grad(), pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(
            serve, model().eval(), torch.randn(3, 4), directory=tmp_path, tracer=TRACERS[tracer]()
        )
    assert "make_shared.<locals>.act" in str(refused.value), refused.value
    assert "the lru_cache of cached_shared" in str(refused.value), refused.value


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_registry_entry_sharing_its_code_with_a_named_one_is_watched(
    tracer: str, tmp_path: Path
) -> None:
    """A registry entry the trace read, made by the factory that also made ``SHARED``:
    Dynamo recorded the code by SHARED's name only and served a swap of the entry's
    ``__code__`` stale. The entry is watched at the path the trace read it, as one no
    name reaches: served equal to eager in a fresh process, and the swap refused."""
    out = attack_in_child(
        SHARED_CHILD,
        serve,
        UsesRegistryShared,
        lambda: torch.randn(3, 4),
        directory=tmp_path,
        tracer=TRACERS[tracer](),
    )
    assert out["first"] == ["served", True], out
    assert out["entry's code swapped"][0] == "refused", out
