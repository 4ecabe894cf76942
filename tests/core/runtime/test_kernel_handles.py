"""Issue 29: the eager backend's emitted graph calls each ATen op through its C++ handle,
bound once at load, not through the Python ``OpOverload.__call__`` wrapper per call --
with the same results, in a fresh process.

The MLP and a GPT-2-block-shaped model (layer norm, attention, GELU: many distinct ops)
are captured with make_fx; a fresh process loads each artifact with
``OpOverload.__call__`` instrumented, serves calls with changed weights and inputs, and
compares with eager. Before the handles, every op of every call went through the
wrapper (the count was ops x calls)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.harness import capture_pair, run_python


class Block(nn.Module):
    """Pre-norm causal self-attention and a GELU MLP, tiny (GPT-2's block shape)."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc = nn.Linear(d, 2 * d)
        self.out = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(nn.functional.gelu(self.fc(x), approximate="tanh"))


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


CASES = {"mlp": (_mlp, (8, 64)), "block": (Block, (2, 5, 16))}

CHILD = """
import torch, torch._ops, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_kernel_handles import CASES
wrapped = [0]
original = torch._ops.OpOverload.__call__
def counting(self, /, *args, **kwargs):
    wrapped[0] += 1
    return original(self, *args, **kwargs)
torch._ops.OpOverload.__call__ = counting
import precompile
run = precompile.load({artifact!r}, {cache!r})
factory, shape = CASES[{name!r}]
torch.manual_seed(1)  # other weights and inputs than the capture's
model = factory().eval()
worst = 0.0
for grad in (True, False):
    with torch.set_grad_enabled(grad):
        for _ in range(3):
            x = torch.randn(*shape)
            before = wrapped[0]
            got = run(model, x)
            served_wrapped = wrapped[0] - before
            want = model(x)
            torch.testing.assert_close(got, want)
            assert served_wrapped == 0, served_wrapped
            worst = max(worst, float((got - want).abs().max()))
print("OK", worst)
"""


@pytest.mark.parametrize("name", sorted(CASES))
def test_graph_calls_kernel_handles_with_eager_results(name: str, tmp_path: Path) -> None:
    factory, shape = CASES[name]
    torch.manual_seed(0)
    artifact, cache = capture_pair(serve, factory().eval(), torch.randn(*shape), directory=tmp_path)
    source = Path(artifact).read_text()
    graph = source[source.index("def _graph(") : source.index("def call(")]
    # Every op in the graph goes through a handle bound once, named after its op.
    assert "torch.ops." not in graph, graph
    assert "_k_aten_addmm_default = _kernel(torch.ops.aten.addmm.default)" in source
    proc = run_python(textwrap.dedent(CHILD.format(artifact=artifact, cache=cache, name=name)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK"), proc.stdout


def test_a_graph_value_named_like_a_handle_keeps_the_op_spelled_out() -> None:
    """A handle name that the graph already uses for a value would be shadowed inside
    the graph function: that op keeps its ``torch.ops`` spelling (and still runs)."""
    from precompile.capturing.graph_code import bind_kernel_handles

    gm = torch.fx.symbolic_trace(lambda x: x)
    graph = gm.graph
    x = next(iter(graph.nodes))
    with graph.inserting_after(x):
        relu = graph.call_function(torch.ops.aten.relu.default, (x,))
        relu.name = "_k_aten_relu_default"
    with graph.inserting_after(relu):
        neg = graph.call_function(torch.ops.aten.neg.default, (relu,))
    output = next(n for n in graph.nodes if n.op == "output")
    output.args = (neg,)
    graph.eliminate_dead_code()
    gm.recompile()
    source = bind_kernel_handles(gm, gm.code)
    assert "torch.ops.aten.relu.default(" in source
    assert "_k_aten_neg_default = _kernel(torch.ops.aten.neg.default)" in source
    namespace: dict[str, object] = {"torch": torch}
    exec(
        "def _kernel(op):\n    return getattr(op, '_op', op)\n"
        + source.replace("def forward(self", "def f(self"),
        namespace,
    )
    x_value = torch.tensor([-1.0, 2.0])
    assert torch.equal(namespace["f"](None, x_value), -torch.relu(x_value))  # type: ignore[operator]
