"""Issue 29: what a served call costs against the eager module and the raw graph.

For each model (the MLP ``Linear(64,128) -> ReLU -> Linear(128,10)`` at batch 8, a
ResNet-18-shaped net on a 1x3x32x32 input, a GPT-2-block-shaped net with d 64, 2 heads,
sequence 16), each tracer (make_fx, Dynamo) and backend (eager, Inductor), and grad mode
on and off, three contenders are timed interleaved in one process with one intra-op
thread, best of interleaved rounds (``best_per_call_us``):

- ``artifact``: the loaded runnable, as a server calls it;
- ``eager``: the module itself;
- ``raw graph``: the artifact's own captured graph(s), called with the very arguments
  and grad mode the served call passed them (recorded by swapping the graph for a
  recorder for one call), without any driver around it; for a make_fx Inductor
  artifact, Inductor's own ``call`` (the input asserts the driver proves restored).

Then a per-call breakdown of the served MLP call: each piece of the driver timed alone
on its own (the serving wrapper, the surface check, the model-state fast path, the
input and ambient checks, the dependency and guard checks of Dynamo). Run:
``python bench/run.py percall`` (about 2-3 minutes), or ``python -m bench.percall``.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import precompile
from bench.harness import table
from bench.models import ResNet18


class GPT2Block(nn.Module):
    """GPT-2's transformer block (pre-norm causal self-attention, then a GELU MLP), tiny."""

    def __init__(self, d: int = 64, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU(approximate="tanh")
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


#: name -> (model factory, input shape, calls per round, rounds): short rounds, many of
#: them, so that the best round of each contender falls in a quiet moment.
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], int, int]] = {
    "mlp": (_mlp, (8, 64), 300, 25),
    "resnet18 (1x3x32x32)": (lambda: ResNet18(10), (1, 3, 32, 32), 10, 7),
    "gpt2 block (d64, 2 heads, seq 16)": (GPT2Block, (1, 16, 64), 60, 25),
}


def best_per_call_us(
    contenders: dict[str, Callable[[], Any]], *, rounds: int, calls: int, warmup: int = 20
) -> dict[str, float]:
    """Microseconds per call, the contenders interleaved round by round, the best round
    of each: on a shared machine other load only ever adds time, so the fastest round
    is the closest to the call's own cost (a median would report the load)."""
    best = {name: float("inf") for name in contenders}
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    return best


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _cells(fn: Any) -> dict[str, Any]:
    """A closure's free variables by name (the driver's per-call pieces)."""
    return {
        name: cell.cell_contents
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ())
        if _filled(cell)
    }


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


def _recorded_graph(run: Any, model: nn.Module, x: torch.Tensor) -> Callable[[], Any]:
    """The artifact's graph calls of one served call, replayed without the driver: each
    graph with the arguments and the grad mode the driver gave it."""
    namespace = run._namespace
    calls: list[tuple[Callable[..., Any], tuple[Any, ...], bool]] = []
    if "_BACKEND_FNS" in namespace:  # Dynamo: each backend id is seeded into fn's module
        scope = vars(sys.modules[serve.__module__])
        originals = {name: scope[name] for name in namespace["_BACKEND_FNS"] if name in scope}

        def recorder(name: str) -> Any:
            def record(*args: Any) -> Any:
                fn = namespace["_BACKEND_FNS"][name]
                calls.append((fn, args, torch.is_grad_enabled()))
                return originals[name](*args)

            return record

        scope.update({name: recorder(name) for name in originals})
        try:
            run(model, x)
        finally:
            scope.update(originals)
        replays = [
            (_dynamo_inductor_own_call(namespace, fn), args, grad, False)
            for fn, args, grad in calls
        ]
    else:  # make_fx: the graph's boxed call(flat_inputs)
        graph_call = namespace["call"]
        inductor_call = _inductor_own_call(run)

        def record_boxed(flat: list[Any]) -> Any:
            calls.append((graph_call, tuple(flat), torch.is_grad_enabled()))
            return graph_call(flat)

        namespace["call"] = record_boxed
        try:
            run(model, x)
        finally:
            namespace["call"] = graph_call
        replays = [(inductor_call or fn, args, grad, True) for fn, args, grad in calls]
    set_grad = torch._C._set_grad_enabled

    def replay() -> Any:
        previous = torch.is_grad_enabled()
        out = None
        try:
            for fn, args, grad, boxed in replays:
                set_grad(grad)
                out = fn(list(args)) if boxed else fn(*args)
        finally:
            set_grad(previous)
        return out

    return replay


def _inductor_own_call(run: Any) -> Callable[[list[Any]], Any] | None:
    """Inductor's own ``call`` of a make_fx artifact whose graph code has the size/stride
    asserts the driver proves per call turned into comments
    (``inductor_backend.drop_proven_size_asserts``): the same code with them restored,
    what Inductor's output module runs (the raw Inductor call the issue's target is
    measured against). None for any other artifact."""
    namespace = run._namespace
    if not namespace.get("_PROVEN_SIZE_ASSERTS"):
        return None
    from precompile.capturing.inductor_backend import PROVEN_ASSERT

    text = Path(run.artifact_path).read_text()
    start, end = text.index("\nclass Runner:"), text.index("\nrunner = Runner(")
    source = text[start:end].replace(PROVEN_ASSERT, "")
    scope = dict(namespace)
    exec(compile(source, "<inductor's own call>", "exec"), scope)
    return scope["Runner"](partitions=[]).call  # type: ignore[no-any-return]


def _dynamo_inductor_own_call(namespace: dict[str, Any], fn: Any) -> Callable[..., Any]:
    """Inductor's own call of a Dynamo artifact's subgraph whose output module has the
    size/stride asserts its frame guards prove turned into comments (``inductor_backend.
    dynamo_proven_inputs``): the module bound again with them restored, under the same
    per-call input checks; ``fn`` itself for any other subgraph."""
    from precompile.capturing.inductor_backend import PROVEN_ASSERT

    modules = namespace.get("_INDUCTOR_MODULES", {})
    name = next((b for b, f in namespace["_BACKEND_FNS"].items() if f is fn), None)
    if name is None or PROVEN_ASSERT not in modules.get(name, ""):
        return fn  # type: ignore[no-any-return]
    bound = namespace["bind_inductor_module"](
        name, modules[name].replace(PROVEN_ASSERT, ""), namespace["_INDUCTOR"].resolve
    )
    spec = namespace.get("_INPUT_CHECKS", {}).get(name)
    return namespace["check_inputs"](bound, **spec) if spec else bound  # type: ignore[no-any-return]


def _capture(
    name: str, tracer: str, backend: str, workdir: Path
) -> tuple[Any, nn.Module, torch.Tensor, int, int]:
    factory, shape, calls, rounds = MODELS[name]
    torch.manual_seed(0)
    model, x = factory().eval(), torch.randn(*shape)
    stem = workdir / f"{name.split()[0]}-{tracer}-{backend}"
    with precompile.capture(
        serve,
        artifact_path=stem.with_suffix(".py"),
        cache_path=stem.with_suffix(".cache"),
        tracer=precompile.MakeFxTracer() if tracer == "make_fx" else precompile.DynamoTracer(),
        backend=backend,
    ) as cap:
        cap(model, x)
    run = precompile.load(str(stem.with_suffix(".py")), str(stem.with_suffix(".cache")))
    return run, model, x, calls, rounds


def _breakdown(run: Any, model: nn.Module, x: torch.Tensor, raw: Any) -> dict[str, float]:
    """Each piece of one served call, timed alone (best of interleaved rounds)."""
    forward = run._forward
    pieces: dict[str, Callable[[], Any]] = {
        "served call": lambda: run(model, x),
        "artifact forward": lambda: forward(model, x),
        "graph": raw,
    }
    if "_BACKEND_FNS" in run._namespace:
        outer = _cells(forward)
        check = outer["check"]
        # The entry frame is called through the grad-flag stand-ins' wrapper.
        entry = (
            outer["entry"] if "entry" in outer else _cells(outer["_entry_or_stand_ins"])["entry"]
        )
        pieces["dependency checks"] = lambda: check((model, x), {})
        # The driver runs the entry under the captured grad mode (it sets it around the
        # call, which is counted with the state checks below).
        captured_grad = bool(run._namespace.get("GRAD_MODE", torch.is_grad_enabled()))

        def entry_call() -> Any:
            previous = torch.is_grad_enabled()
            torch._C._set_grad_enabled(captured_grad)
            try:
                return entry(model, x)
            finally:
                torch._C._set_grad_enabled(previous)

        pieces["entry frame (guards + graph)"] = entry_call
        # The one-variant frame's own guard check (plain guard program: its tree of
        # dict reads and type/identity leaves, the TENSOR_MATCH leaves as one call, the
        # epilogue), called as the dispatcher calls it.
        frame = _cells(entry)
        only, positional = frame.get("only"), frame.get("positional")
        if only is not None and positional is not None:
            pieces["frame guard check"] = lambda: only(dict(zip(positional, (model, x))))
    else:
        checked = _cells(forward.covers)["checked_inputs"]
        inner = _cells(checked)
        model_tensors = inner["model_tensors"]
        pieces["all checks"] = lambda: checked((model, x), {})
        checked((model, x), {})
        epoch = inner.get("epoch")
        if epoch is not None and epoch[0] is not None:
            epoch = epoch[0]
            # The driver's epoch holds: one tag comparison stands in for the surface's,
            # the builtins' and the model state's own, then the model's other checks.
            from torch._C._dynamo.guards import dict_version

            # (dicts, tags, tensors, key, keyed objects, their keys)
            dicts, versions, key, items, keys = epoch[0], epoch[1], *epoch[3:]
            pieces["epoch"] = lambda: (
                tuple(map(dict_version, dicts)) == versions and tuple(map(key, items)) == keys
            )
            pieces["model tensors + state"] = lambda: model_tensors.rest((model,))
        else:
            pieces["model tensors + state"] = lambda: model_tensors((model,))
            if inner.get("surface_ok") is not None:
                pieces["surface check"] = inner["surface_ok"]
    us = best_per_call_us(pieces, rounds=25, calls=300)
    served, fwd, graph = us["served call"], us["artifact forward"], us["graph"]
    rows = {"serving wrapper (runnable minus forward)": served - fwd}
    if "entry frame (guards + graph)" in us:
        entry_us = us["entry frame (guards + graph)"]
        rows["grad/dtype/autocast/ambient state checks"] = fwd - entry_us - us["dependency checks"]
        rows["dependency checks (hooks, globals, identities)"] = us["dependency checks"]
        if "frame guard check" in us:
            rows["the frame's guard check"] = us["frame guard check"]
            rows["frame dispatch (transformed bytecode, graph call glue)"] = (
                entry_us - graph - us["frame guard check"]
            )
        else:
            rows["guards + frame dispatch"] = entry_us - graph
    else:
        surface = us.get("surface check", us.get("epoch", 0.0))
        if "epoch" in us:
            rows["epoch: one tag comparison for surface, builtins, model dicts"] = surface
            rows["model tensors + state (past the epoch)"] = us["model tensors + state"]
        else:
            rows["surface check"] = surface
            rows["model tensors + state (fast path)"] = us["model tensors + state"]
        rows["input, ambient, grad and dtype checks"] = (
            us["all checks"] - us["model tensors + state"] - surface
        )
        rows["forward glue (grad toggle, outputs)"] = fwd - us["all checks"] - graph
    rows["graph"] = graph
    rows["total (served call)"] = served
    return rows


def _checks_alone(run: Any, model: nn.Module, x: torch.Tensor) -> float:
    """Microseconds of a call's checks alone, no graph: make_fx's ``checked_inputs`` (the
    input, aliasing, ambient, surface, model-state and grad checks) or Dynamo's per-call
    dependency check (hooks, globals, identities, surface, classes, builtins). For models
    whose graph's jitter swamps a difference of two timings."""
    if "_BACKEND_FNS" in run._namespace:
        check = _cells(run._forward)["check"]
        return best_per_call_us({"c": lambda: check((model, x), {})}, rounds=25, calls=300)["c"]
    checked = _cells(run._forward.covers)["checked_inputs"]
    return best_per_call_us({"c": lambda: checked((model, x), {})}, rounds=25, calls=300)["c"]


def run_percall_section(workdir: Path, runs: int) -> str:
    """The section of bench/RESULTS.md. ``runs`` is unused: one process times every row."""
    warnings.simplefilter("ignore")
    torch._logging.set_logs(dynamo=logging.ERROR)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.time()
    rows: list[list[Any]] = []
    breakdowns: dict[tuple[str, str], dict[str, float]] = {}
    alone: list[list[Any]] = []
    verdicts: list[str] = []
    try:
        for name in MODELS:
            for tracer in ("make_fx", "dynamo"):
                for backend in ("eager", "inductor"):
                    run, model, x, calls, rounds = _capture(name, tracer, backend, workdir)
                    for grad in (True, False):
                        with torch.set_grad_enabled(grad):
                            raw = _recorded_graph(run, model, x)
                            us = best_per_call_us(
                                {
                                    "artifact": partial(run, model, x),
                                    "eager": partial(model, x),
                                    "raw": raw,
                                },
                                rounds=rounds,
                                calls=calls,
                                warmup=max(3, calls // 20),
                            )
                            baseline = us["eager"] if backend == "eager" else us["raw"]
                            rows.append(
                                [
                                    name,
                                    tracer,
                                    backend,
                                    "on" if grad else "off",
                                    us["artifact"],
                                    us["eager"],
                                    us["raw"],
                                    us["artifact"] - us["eager"],
                                    us["artifact"] - us["raw"],
                                ]
                            )
                            if name == "mlp":
                                gap = us["artifact"] - baseline
                                versus = "eager module" if backend == "eager" else "raw graph"
                                verdicts.append(
                                    f"{tracer}/{backend}/grad {'on' if grad else 'off'}: "
                                    f"{gap:+.1f} us vs {versus} "
                                    f"({'met' if gap <= 3 else 'NOT met'})"
                                )
                                column = f"{backend}, grad {'on' if grad else 'off'}"
                                breakdowns[(tracer, column)] = _breakdown(run, model, x, raw)
                            if backend == "eager" and not grad:
                                alone.append([name, tracer, _checks_alone(run, model, x)])
                    run.unload()  # a Dynamo artifact of serve holds its module's names
    finally:
        torch.set_num_threads(threads)
    lines = [
        "## Per-call cost against eager and the raw graph (issue 29)",
        "",
        "Microseconds per call in one process, one intra-op thread "
        "(`torch.set_num_threads(1)`), the three contenders interleaved round by round "
        "(best round: other load only adds time; MLP and GPT-2 block 25 rounds of 300 "
        "and 60 calls, ResNet-18 7 rounds of 10). "
        "`artifact` = the loaded runnable; `eager` = the module; `raw graph` = the "
        "artifact's captured graph(s) called with the arguments and grad mode the driver "
        "gave them, without the driver. Models are captured with grad mode on "
        "(`precompile.capture`, inference); each row's grad mode is the call's.",
        "",
        table(
            [
                "model",
                "tracer",
                "backend",
                "grad",
                "artifact",
                "eager",
                "raw graph",
                "artifact - eager",
                "artifact - raw",
            ],
            rows,
        ),
        "",
        "Targets (MLP): served call <= eager module + 3 us on the eager backend, <= raw "
        "Inductor call + 3 us on Inductor. " + "; ".join(verdicts) + ".",
    ]
    for tracer in ("make_fx", "dynamo"):
        columns = {column: parts for (t, column), parts in breakdowns.items() if t == tracer}
        pieces = list(next(iter(columns.values())))
        lines += [
            "",
            f"Where a served MLP call's microseconds go, {tracer} (each piece timed alone, "
            "best of 25 interleaved rounds of 300 calls; rows that are differences of two "
            "timings carry the jitter of both):",
            "",
            table(
                ["piece", *columns],
                [[piece, *(parts[piece] for parts in columns.values())] for piece in pieces],
            ),
        ]
    lines += [
        "",
        "The checks of a call alone, no graph (eager backend, grad off; best of 25 "
        "interleaved rounds of 300 calls): make_fx's `checked_inputs` (inputs and their "
        "aliasing, ambient context, library surface, builtins, model state, grads) and "
        "Dynamo's per-call dependency check (hooks, globals, identities, library surface, "
        "classes, builtins; its ambient state and tensor guards run in the frame), per "
        "model: the same checks over more parameters, buffers and modules:",
        "",
        table(["model", "tracer", "checks alone (us)"], alone),
    ]
    lines += [
        "",
        "Reading: with the eager backend the make_fx graph calls each ATen op's C++ "
        "handle, which pays for the driver's checks; under grad on the artifact is faster "
        "than eager (it runs without autograd). make_fx: one epoch comparison (the "
        "version tags of the dicts the surface, builtins and model-state checks watch, "
        "against the tags each recorded) stands in for those checks' own comparisons "
        "(bench/results/percall_epoch.md); the capture records only what the user's call "
        "ran, and leaves out the store/delete dunders it never entered (15 identities for "
        "the MLP, from 29: percall_fx2.md, percall_fx3.md); a served call runs the "
        "epoch-pass checks in the driver's own frame, 5 Python frames in all "
        "(percall_fx3.md). What is left past the epoch is the model state's identities "
        "(submodules' instance dicts, functions' code and cells: no dict's version tag "
        "sees `m.__dict__ = d` or a `__code__` swap), types, empty hook dicts and one "
        "C-level tensor guard, and the input check. Dynamo: the guard check inlines its "
        "identity and type leaves and checks its tensors with one TensorGuards call, a "
        "one-variant frame is dispatched in one Python frame (dynamo_percall.md, "
        "dynamo_percall2.md), and the dependency checks (library surface, classes, "
        "builtins, global and module hooks) are one epoch per call (dynamo_percall3.md); "
        "an inlined Inductor subgraph skips the input asserts its frame's guards prove "
        "(percall_dyn4.md). Why Dynamo with Inductor stays above raw + 3 us: what is "
        "left is many small Python-level checks, each 20-50 ns, none large: the frame's "
        "guard check is one straight-line function of about 50 dict reads and type, "
        "identity and marking leaves through the model's dicts, plus one TensorGuards "
        "call; the dependency epoch compares the version tags of the 13 dicts it "
        "watches and of the modules' 4 instance dicts, the instance dicts' identities, "
        "23 empty hook dicts and 4 classes' MROs (about 0.1-0.5 us per group, "
        "bench/results/percall_dyn5.md). Memoizing the guard walk on the dicts' tags "
        "costs as much as the walk (tried: 1.8 against 1.7 us). What would close the "
        "gap is running both as one C++ guard tree (torch's RootGuardManager), but "
        "every accessor of that tree (`getattr_manager`, `dict_getitem_manager`, ...) "
        "imports torch._dynamo for its GuardManagerType enum (checked on torch 2.13: "
        "`RootGuardManager().getattr_manager('x', 'L[x]', 1, None)` leaves "
        "torch._dynamo in sys.modules), and `import torch._dynamo` costs about as much "
        "again as `import torch` (2.8 against 1.4 s here): every Dynamo artifact's "
        "load and first call, served today without importing torch._dynamo (issue 14: "
        "<= 1.3x `import torch` with Inductor), would pay over a second for under 3 us "
        "a call. Not done: the cold start is kept, and the Dynamo/Inductor target is "
        "not met by that margin. "
        "On Inductor the raw graph row runs Inductor's own `call`; a make_fx "
        "artifact's `call` is that code without the size/stride asserts on the graph "
        "inputs that the driver proves per call (about 0.4 us each, the MLP's five: "
        "percall_fx4.md), so its difference is the driver less those asserts. "
        "Microseconds scale with the machine, the driver's with the graph's: compare "
        "rows of one table, not figures across sections (the same code measured the "
        "MLP's raw make_fx graph at 9.0 us on the machine of the table this one "
        "replaced, where dynamo/eager grad off was +1.9 us over eager, and at 13.8 us "
        "on the 2026-12-05 machine, where it was +4.2 us).",
        "",
        f"Section wall time: {time.time() - started:.0f} s.",
    ]
    return "\n".join(lines)


def main() -> None:
    # Dynamo artifacts need serve importable: run the section from bench.percall, not
    # from __main__.
    from bench import percall

    with tempfile.TemporaryDirectory() as directory:
        print(percall.run_percall_section(Path(directory), 1))


if __name__ == "__main__":
    main()
