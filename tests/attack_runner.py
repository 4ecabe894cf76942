"""The attack files' one runner (tests/core/runtime/test_attacks_round*.py).

An attack file lists scenarios (``Attack``): a tiny model, the change an attack makes to
it and how the play goes around it. ``AttackSuite`` captures every scenario by a tracer
here (a ``group`` of scenarios shares one capture), then in ONE fresh process per tracer
plays each scenario twice from the same starting state -- through the loaded artifact
and eagerly: the change before ``load`` or two calls, the change, a third call -- and
compares all each play returns (its answers and the scenario's ``probe`` of the state it
leaves). A cell's outcome is ``[kind, detail]``: ``"served"`` (equal to eager or not),
``"refused"`` (a PrecompileError, at capture or at a step of the play), ``"failed as
eager does"``, ``"failed otherwise"``, ``"served where eager fails"``, or ``"not served
before the change"`` (where the suite asks it: the model the first two calls see is the
captured one, and the artifact did not answer them as eager does).
``tests.harness.assert_attack_outcome`` is the verdict on it.
"""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

import precompile
from tests.harness import assert_attack_outcome, capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


def _no_probe(model: nn.Module) -> Any:
    return None


class Attack(NamedTuple):
    factory: Callable[[], nn.Module]
    #: made after two served calls; may return a call ``call(fn, model, x)`` to make
    change: Callable[[nn.Module], Any]
    #: state the play leaves that must match eager's
    probe: Callable[[nn.Module], Any] = _no_probe
    backend: str = "eager"
    #: the change made before ``load`` (else after two served calls)
    before_load: bool = False
    #: run right after ``load`` (e.g. holders filled again by the same makers)
    after_load: Callable[[], Any] | None = None
    #: global module hooks installed (by the function that registers each) around the
    #: capture and each play
    hooks: tuple[tuple[Callable[..., Any], Callable[..., Any]], ...] = ()
    #: scenarios of one group share one capture (the same factory and backend)
    group: str | None = None
    #: the artifact captured for training (``capture(training=True)``, grad on), of ``fn``
    training: bool = False
    #: the function captured and served (else the suite's ``serve``)
    fn: Callable[..., Any] | None = None
    #: the tracers attacked (both, but where a wrong answer is left)
    tracers: tuple[str, ...] = ("dynamo", "make_fx")

    @property
    def settled(self) -> bool:
        """Whether the first two calls see the model as captured: no change before
        ``load``, nothing after it, no global hook that changes state per call (in a
        suite of ``unchanged_served``, the artifact must answer them as eager does)."""
        return not (self.before_load or self.after_load or self.hooks)


def _detach(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return [_detach(v) for v in value]
    return value


def same(a: Any, b: Any) -> bool:
    """Tensors equal in dtype, shape and value (NaN equal to NaN), nested in lists,
    tuples and dicts alike; anything else by ``==``."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.allclose(a, b, equal_nan=True))
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(p, q) for p, q in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


_SUITES: dict[str, AttackSuite] = {}

_CHILD = """
import importlib, json, warnings
warnings.simplefilter("ignore")
importlib.import_module({module!r})
from tests.attack_runner import suite
print(json.dumps(suite({module!r}).attack({pairs!r})))
"""


def suite(module: str) -> AttackSuite:
    """The suite the (imported) attack file ``module`` made."""
    return _SUITES[module]


class AttackSuite:
    """One attack file's scenarios, and what its tests ask of them."""

    def __init__(
        self,
        module: str,
        scenarios: dict[str, Attack],
        *,
        serve: Callable[..., Any],
        reset: Callable[[], Any] = lambda: None,
        classes: tuple[type, ...] = (),
        known_needless: dict[tuple[str, str], str],
        known_wrong: dict[tuple[str, str], tuple[str, str]] | None = None,
        unchanged_served: bool = False,
    ) -> None:
        """``module`` is the attack file's import name (its fresh process imports it);
        ``serve`` its ``serve(model, x)``, defined there: the globals it runs in are part
        of what a capture reads;
        ``reset`` puts the file's global state back and runs before and after every
        capture and play, as does the restore of ``classes``' attributes (a change that
        patches a class). ``unchanged_served``: the model as captured must be captured and
        served as eager (a file of ordinary models whose forward changes no state): a
        PrecompileError at capture fails the tracer, and a settled scenario's first two
        calls not answered as eager are ``"not served before the change"``; else either
        is a refusal like any other."""
        self.module = module
        self.scenarios = scenarios
        self.serve = serve
        self.no_ops = {name for name in scenarios if "(no-op)" in name}
        self._reset = reset
        self._class_dicts = {cls: dict(cls.__dict__) for cls in classes}
        self.known_needless = known_needless
        self.known_wrong = known_wrong
        self.unchanged_served = unchanged_served
        self._outcomes: dict[str, dict[str, list[Any]]] = {}
        _SUITES[module] = self

    def reset(self) -> None:
        """The classes' attributes as they were when the suite was made, then the file's
        ``reset``."""
        for cls, saved in self._class_dicts.items():
            for key in set(cls.__dict__) - set(saved):
                delattr(cls, key)
            for key, value in saved.items():
                if cls.__dict__.get(key) is not value:
                    setattr(cls, key, value)
        self._reset()

    @contextlib.contextmanager
    def _started(self, scenario: Attack) -> Iterator[tuple[nn.Module, torch.Tensor]]:
        """The starting state: reset, seed 0, a fresh model and input, the scenario's
        hooks installed, grad as its artifact is captured; all undone after."""
        self.reset()
        torch.manual_seed(0)
        model = scenario.factory()
        x = torch.randn(3, 4)
        handles = [register(hook) for register, hook in scenario.hooks]
        try:
            with torch.enable_grad() if scenario.training else torch.no_grad():
                yield model, x
        finally:
            for handle in handles:
                handle.remove()
            self.reset()

    def play(self, name: str, load: Callable[[], Any]) -> dict[str, Any]:
        """From the scenario's starting state: ``load()`` (the artifact, or eager's
        ``fn``), two calls, the change, a third call; the answers and the probe, or the
        exception raised, at which step, and the answers before it."""
        scenario = self.scenarios[name]
        answers: list[Any] = []
        step = "load"
        with self._started(scenario) as (model, x):
            try:
                call = scenario.change(model) if scenario.before_load else None
                fn = load()
                if scenario.after_load is not None:
                    scenario.after_load()
                for _ in range(2):
                    step = "first calls"
                    answers.append(_detach(fn(model, x)))
                if not scenario.before_load:
                    step = "change"
                    call = scenario.change(model)
                step = "changed call"
                answers.append(_detach((call or (lambda f, m, v: f(m, v)))(fn, model, x)))
                step = "probe"
                return {"answers": answers, "probe": _detach(scenario.probe(model))}
            except Exception as error:
                return {"error": error, "step": step, "answers": answers}

    def attack(self, pairs: dict[str, list[str]]) -> dict[str, list[Any]]:
        """In this (fresh) process: each scenario played through its loaded artifact and
        eagerly; its outcome."""
        outcomes: dict[str, list[Any]] = {}
        for name, (artifact, cache) in pairs.items():
            if artifact == "refused at capture":
                outcomes[name] = ["refused", cache]
                continue
            scenario = self.scenarios[name]
            got = self.play(name, lambda a=artifact, c=cache: precompile.load(a, c))
            want = self.play(name, lambda f=scenario.fn or self.serve: f)
            error = got.get("error")
            if (
                self.unchanged_served
                and scenario.settled
                and not same(got["answers"][:2], want["answers"][:2])
            ):
                said = f"{got['step']}: {error!r}" if "error" in got else "answers differ"
                outcomes[name] = ["not served before the change", said]
            elif isinstance(error, precompile.PrecompileError):
                outcomes[name] = ["refused", f"{got['step']}: {error}"]
            elif error is not None and type(error) is type(want.get("error")):
                outcomes[name] = ["failed as eager does", repr(error)]
            elif error is not None:
                outcomes[name] = ["failed otherwise", f"{got['step']}: {error!r}"]
            elif "error" in want:
                outcomes[name] = ["served where eager fails", repr(want["error"])]
            else:
                outcomes[name] = ["served", same(got, want)]
        return outcomes

    def capture_all(self, tracer: str, directory: Path) -> dict[str, list[str]]:
        """Every scenario of ``tracer`` captured from its starting state: its artifact
        pair, or ``["refused at capture", words]``."""
        pairs: dict[str, list[str]] = {}
        groups: dict[str, list[str]] = {}
        for k, (name, scenario) in enumerate(self.scenarios.items()):
            if tracer not in scenario.tracers:
                continue
            if scenario.group is not None and scenario.group in groups:
                pairs[name] = groups[scenario.group]
                continue
            try:
                with self._started(scenario) as (model, x):
                    pairs[name] = list(
                        capture_pair(
                            scenario.fn or self.serve,
                            model,
                            x,
                            directory=directory,
                            name=f"{tracer}_{k}",
                            tracer=TRACERS[tracer](),
                            training=scenario.training,
                            backend=scenario.backend,
                        )
                    )
            except precompile.PrecompileError as error:
                if self.unchanged_served:
                    raise
                pairs[name] = ["refused at capture", f"capture: {error}"]
            if scenario.group is not None:
                groups[scenario.group] = pairs[name]
        return pairs

    def outcomes(self, tracer: str, factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
        """Every scenario of ``tracer`` captured here and attacked in one fresh process."""
        if tracer not in self._outcomes:
            pairs = self.capture_all(tracer, factory.mktemp(tracer))
            child = _CHILD.format(module=self.module, pairs=pairs)
            self._outcomes[tracer] = run_json(textwrap.dedent(child))
        return self._outcomes[tracer]

    def cases(self, *, no_ops: bool) -> list[tuple[str, str]]:
        """The ``(tracer, scenario)`` cells of the no-ops or of the other changes."""
        names = self.no_ops if no_ops else set(self.scenarios) - self.no_ops
        return [(t, n) for n in sorted(names) for t in sorted(self.scenarios[n].tracers)]

    def check(
        self, tracer: str, scenario: str, factory: pytest.TempPathFactory, *, no_op: bool
    ) -> None:
        """The verdict on one cell (``assert_attack_outcome``)."""
        assert_attack_outcome(
            tracer,
            scenario,
            self.outcomes(tracer, factory)[scenario],
            no_op=no_op,
            known_needless=self.known_needless,
            known_wrong=self.known_wrong,
        )
