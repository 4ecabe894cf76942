"""Issue 29, the Dynamo driver: each per-call fast path is attacked by changing what it
skips after calls already took it, in a fresh process, and the change is still caught.

The fast paths: the guard check writes identity and exact-type leaves inline and the
epilogue as one function (``multigraph_guards``); a frame of one variant is chosen by
its one check (``variant_chooser``); the ambient state (modes, default dtype,
deterministic mode, autocast) is one tuple compare (``serve_as_captured``); the checks
that watch dicts by version tag are one compare of all their tags (``watch_together``);
torch's global hook dicts are one read (``_watchers_aside``); those dicts and the
module-hook check's are one epoch per call (``_dependency_epoch``: the model by identity,
its submodules' instance dicts by identity, hook and ``_modules`` dicts by tag or
emptiness); the pregraph profiler range is skipped with the profiler off. After two served calls, each change below is
made and the next call must answer as eager does on the changed state or refuse with a
PrecompileError -- never answer from the stale state; where eager's answer changes, it
must refuse (or match it)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.harness import attack_in_child


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class DoublingLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


CHILD = """
import json, torch, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_dynamo_fast_path_attacks import attack
print(json.dumps(attack({artifact!r}, {cache!r})))
"""


def attack(artifact: str, cache: str) -> dict[str, list[Any]]:
    """In this process: per change, a fresh model served twice (the fast paths taken),
    the change made (a context: undone after the call), the next call's outcome:
    ["served", equal to eager under the change] or ["refused", message]."""
    import contextlib
    import copy

    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    run = precompile.load(artifact, cache)
    torch.manual_seed(1)
    base = Net().eval()
    x = torch.randn(3, 8)

    @contextlib.contextmanager
    def setting(owner: Any, name: str, value: Any) -> Any:
        before = getattr(owner, name)
        setattr(owner, name, value)
        try:
            yield
        finally:
            setattr(owner, name, before)

    @contextlib.contextmanager
    def default_dtype(dtype: torch.dtype) -> Any:
        torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(torch.float32)

    @contextlib.contextmanager
    def deterministic() -> Any:
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(False)

    @contextlib.contextmanager
    def global_hook() -> Any:
        handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: o)
        try:
            yield
        finally:
            handle.remove()

    class Watching(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            return func(*args, **(kwargs or {}))

    class Dispatching(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            return func(*args, **(kwargs or {}))

    def doubled_relu(value: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        return torch.relu(value) * 2

    def tripled_forward(self: Any, value: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(value, self.weight, self.bias) * 3

    def doubling(module: Any, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        return output * 2

    @contextlib.contextmanager
    def hooked(module: nn.Module) -> Any:
        handle = module.register_forward_hook(doubling)
        try:
            yield
        finally:
            handle.remove()

    @contextlib.contextmanager
    def shadowed(module: nn.Module) -> Any:
        vars(module)["act"] = nn.Tanh()  # read before _modules["act"] by Python
        try:
            yield
        finally:
            del vars(module)["act"]

    @contextlib.contextmanager
    def swapped_dict(module: nn.Module) -> Any:
        # the hook dicts read through the new instance dict, the old ones left empty
        from collections import OrderedDict

        before = module.__dict__
        module.__dict__ = {**before, "_forward_hooks": OrderedDict([(10**6, doubling)])}
        try:
            yield
        finally:
            module.__dict__ = before

    @contextlib.contextmanager
    def touched(module: nn.Module) -> Any:
        # a store and its undoing: tags move, contents as they were
        module._modules["extra"] = nn.ReLU()
        del module._modules["extra"]
        module.fc1._forward_hooks[10**6] = doubling
        del module.fc1._forward_hooks[10**6]
        yield

    @contextlib.contextmanager
    def replaced_then_hooked(model: nn.Module, module: nn.Module) -> Any:
        # a hook dict replaced by an empty one (a call served: nothing to refuse), then
        # a hook added to the new dict: the epoch must watch the dict now there
        from collections import OrderedDict

        before = module._forward_hooks
        module._forward_hooks = OrderedDict()
        torch.testing.assert_close(run(model, x), model(x))
        module._forward_hooks[10**6] = doubling
        try:
            yield
        finally:
            module._forward_hooks = before

    changes: dict[str, Any] = {
        # the guard tree's inline leaves (TYPE_MATCH of a submodule, EQUALS_MATCH of
        # the _modules keys) and its tensor leaves
        "submodule class swapped": lambda m: setting(m.fc2, "__class__", DoublingLinear),
        "submodule replaced by another class": lambda m: setting(m, "act", nn.Tanh()),
        "_modules keys renamed": lambda m: setting(
            m, "_modules", {("first" if k == "fc1" else k): v for k, v in m._modules.items()}
        ),
        "weight of another shape": lambda m: setting(
            m.fc1, "weight", nn.Parameter(torch.randn(16, 9))
        ),
        # the ambient state, one tuple compare
        "default dtype float64": lambda m: default_dtype(torch.float64),
        "deterministic algorithms on": lambda m: deterministic(),
        "autocast on": lambda m: torch.autocast("cpu", dtype=torch.bfloat16),
        "a torch function mode": lambda m: Watching(),
        "a torch dispatch mode": lambda m: Dispatching(),
        # the dicts watched together (library surface, classes, global hooks)
        "library function rebound": lambda m: setting(F, "relu", doubled_relu),
        "class method rebound": lambda m: setting(nn.Linear, "forward", tripled_forward),
        "global forward hook": lambda m: global_hook(),
        # the dependency epoch: the model by identity, its submodules' instance dicts by
        # identity, the hook and _modules dicts by tag (or emptiness), one compare
        "parameter replaced, same shape": lambda m: setting(
            m.fc1, "weight", nn.Parameter(torch.randn(16, 8))
        ),
        "parameter .data swapped": lambda m: setting(m.fc1.weight, "data", torch.randn(16, 8)),
        "submodule replaced by Identity": lambda m: setting(m, "act", nn.Identity()),
        "first submodule replaced by Identity": lambda m: setting(m, "fc1", nn.Identity()),
        "forward hook on a submodule": lambda m: hooked(m.fc1),
        "training flipped on a submodule": lambda m: setting(m.fc1, "training", True),
        "instance __dict__ entry shadowing a submodule": lambda m: shadowed(m),
        "instance __dict__ replaced, carrying a hook": lambda m: swapped_dict(m.fc1),
        "_modules mutated and restored": lambda m: touched(m),
        "hook dict replaced, then a hook added to it": lambda m: replaced_then_hooked(m, m.fc1),
    }
    outcomes: dict[str, list[Any]] = {}
    with torch.no_grad():
        for name, change in changes.items():
            model = copy.deepcopy(base)
            for _ in range(2):
                torch.testing.assert_close(run(model, x), model(x))
            with change(model):
                try:
                    got: Any = run(model, x)
                except Exception as error:  # a refusal, or anything else (a row's failure)
                    got = error
                try:
                    want: Any = model(x)
                except Exception as error:
                    want = error
            if isinstance(got, precompile.PrecompileError):
                outcomes[name] = ["refused", str(got)]
            elif isinstance(got, Exception):
                outcomes[name] = ["failed otherwise", repr(got)]
                continue
            elif isinstance(want, Exception):
                outcomes[name] = ["served where eager fails", repr(want)]
            else:
                same = got.dtype == want.dtype and torch.allclose(got, want.to(got.dtype))
                outcomes[name] = ["served", bool(same and got.dtype == want.dtype)]
            # Undone: served again, and a second change after it caught too (each
            # fast path took its snapshot again after the refusal).
            torch.testing.assert_close(run(model, x), model(x))
        model = copy.deepcopy(base)
        run(model, x)
        with setting(F, "relu", doubled_relu):
            try:
                run(model, x)
                outcomes["changed again after a restore"] = ["served", False]
            except precompile.PrecompileError as error:
                outcomes["changed again after a restore"] = ["refused", str(error)]
        # the dependency epoch compares the model's identity: another model object
        # (its own weights; then one carrying a hook) after two calls with this one
        for name, hook in (("another model object", False), ("another model, hooked", True)):
            run(model, x)
            other = copy.deepcopy(model)
            with torch.no_grad():
                for p in other.parameters():
                    p.mul_(-1)
            if hook:
                other.fc2.register_forward_hook(doubling)
            try:
                outcomes[name] = ["served", bool(torch.allclose(run(other, x), other(x)))]
            except precompile.PrecompileError as error:
                outcomes[name] = ["refused", str(error)]
        # one variant chosen by its one check: another input is refused in its words
        try:
            run(model, torch.randn(3, 9))
            outcomes["input of another width"] = ["served", False]
        except precompile.PrecompileError as error:
            outcomes["input of another width"] = ["refused", str(error)]
        except Exception as error:
            outcomes["input of another width"] = ["failed otherwise", repr(error)]
        # the pregraph profiler range, skipped only with the profiler off
        with torch.profiler.profile() as profiled:
            got = run(model, x)
        names = {event.name for event in profiled.events()}
        outcomes["profiled"] = [
            "served",
            bool(torch.allclose(got, model(x)) and "Pregraph bytecode" in names),
        ]
    return outcomes


#: Each change whose eager answer differs from the captured one (or that eager cannot
#: run): the artifact must refuse it, naming what changed.
MUST_REFUSE = {
    "submodule class swapped": "",
    "submodule replaced by another class": "",
    "_modules keys renamed": "",
    "weight of another shape": "",
    "default dtype float64": "default dtype",
    "deterministic algorithms on": "deterministic algorithms off; this process has torch.float32 and on",
    "autocast on": "torch.autocast",
    "library function rebound": "relu",
    "class method rebound": "forward",
    "global forward hook": "global hook",
    "changed again after a restore": "relu",
    "input of another width": "no captured variant",
    "submodule replaced by Identity": "`model.act` is not a ReLU",
    "first submodule replaced by Identity": "`model.fc1` is not a Linear",
    "forward hook on a submodule": "was added to `model.fc1` after capture",
    "instance __dict__ entry shadowing a submodule": "`model.act` is shadowed",
    "instance __dict__ replaced, carrying a hook": "was added to `model.fc1` after capture",
    "another model, hooked": "was added to `model.fc2` after capture",
    "hook dict replaced, then a hook added to it": "was added to `model.fc1` after capture",
}

#: Each change the captured graph computes as eager does: served, equal to eager (a
#: refusal of these would make the artifact unusable, not safer).
MUST_SERVE = [
    "parameter replaced, same shape",
    "parameter .data swapped",
    "training flipped on a submodule",
    "_modules mutated and restored",
    "another model object",
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    return dict(
        attack_in_child(
            CHILD,
            serve,
            lambda: Net().eval(),
            lambda: torch.randn(3, 8),
            directory=tmp_path_factory.mktemp("dynamo"),
            tracer=precompile.DynamoTracer(),
        )
    )


@pytest.mark.parametrize("change", sorted(MUST_REFUSE))
def test_a_change_behind_a_fast_path_is_refused_in_its_words(
    outcomes: dict[str, list[Any]], change: str
) -> None:
    kind, detail = outcomes[change]
    assert kind == "refused", (change, kind, detail)
    assert MUST_REFUSE[change] in detail, (change, detail)


@pytest.mark.parametrize("change", ["a torch function mode", "a torch dispatch mode", "profiled"])
def test_a_change_that_may_be_served_is_served_as_eager_or_refused(
    outcomes: dict[str, list[Any]], change: str
) -> None:
    kind, detail = outcomes[change]
    assert kind in ("served", "refused"), (change, kind, detail)
    if kind == "served" or change == "profiled":
        assert [kind, detail] == ["served", True], (change, kind, detail)


@pytest.mark.parametrize("change", MUST_SERVE)
def test_a_change_the_graph_computes_is_served_as_eager(
    outcomes: dict[str, list[Any]], change: str
) -> None:
    assert outcomes[change] == ["served", True], (change, outcomes[change])
