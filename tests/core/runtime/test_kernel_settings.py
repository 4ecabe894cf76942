"""A kernel whose implementation torch chooses by a process-wide setting read in C++ --
``F.scaled_dot_product_attention`` and the attention backend flags that
``torch.nn.attention.sdpa_kernel`` sets -- is served only under the settings of its
capture where the artifact holds the choice.

helper-79 found make_fx artifacts (both backends) and Dynamo with Inductor serving the
capture's fused kernel under ``sdpa_kernel(SDPBackend.MATH)``, where eager runs the math
composition (other numbers: 2e-3 apart in bf16), and answering under
``sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)``, where eager raises "No viable backend".
No Python frame reads those flags, so the settings check never saw them; the capture
now records what such a kernel reads (``_compat.kernel_settings``) and the artifact
compares it per call (``runtime.setting_checks``). Dynamo's eager backend calls
``scaled_dot_product_attention`` per call under the call's flags, as eager does: served
exactly under every setting, raising where eager raises.

Each tracer and backend, in a fresh process: the attention called directly, as the ATen
operator (``torch.ops.aten.scaled_dot_product_attention``), inside fn's own
``sdpa_kernel`` block and through ``nn.MultiheadAttention`` (torch.nn's code makes the
call), ordinary calls served exactly before and after a refused one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import run_json

MODELS = """import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class Attn(torch.nn.Module):
    def __init__(self, n=16):
        super().__init__()
        self.qkv = torch.nn.Linear(n, 3 * n)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, -1)).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v)


class Aten(Attn):
    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, -1)).permute(2, 0, 3, 1, 4)
        return torch.ops.aten.scaled_dot_product_attention(q, k, v)


class Own(Attn):  # chooses its kernel itself, whatever the caller's flags
    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, -1)).permute(2, 0, 3, 1, 4)
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v)


class Mha(torch.nn.Module):
    def __init__(self, n=16):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(n, 2, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def call(model, x):
    return model(x)


def make(name):
    torch.manual_seed(0)
    model = {"attn": Attn, "aten": Aten, "own": Own, "mha": Mha}[name]().eval()
    x = torch.randn(2, 64, 16)
    if name != "mha":  # where the kernels differ most
        return model.to(torch.bfloat16), x.to(torch.bfloat16)
    return model, x
"""

CAPTURE = """
import warnings, torch, precompile
import kmodels
warnings.simplefilter("ignore")
for name in ("attn", "aten", "own", "mha"):
    model, x = kmodels.make(name)
    tracer = precompile.MakeFxTracer() if {tracer!r} == "make_fx" else precompile.DynamoTracer()
    with torch.no_grad(), precompile.capture(
        kmodels.call, artifact_path=f"{{name}}.py", cache_path=f"{{name}}.cache",
        tracer=tracer, backend={backend!r},
    ) as cap:
        cap(model, x)
print("{{}}")
"""

SERVE = """
import contextlib, json, warnings, torch, precompile
import kmodels
from torch.nn.attention import SDPBackend, sdpa_kernel
warnings.simplefilter("ignore")
settings = {{
    "ordinary": contextlib.nullcontext,
    "math": lambda: sdpa_kernel(SDPBackend.MATH),
    "efficient": lambda: sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION),
    "ordinary again": contextlib.nullcontext,
}}
cells = {{}}
for name in ("attn", "aten", "own", "mha"):
    run = precompile.load(f"{{name}}.py", f"{{name}}.cache")
    model, x = kmodels.make(name)
    for setting, context in settings.items():
        with torch.no_grad(), context():
            try:
                want = kmodels.call(model, x)
            except RuntimeError as error:
                want = "raises: " + str(error)
            try:
                got = run(model, x)
            except precompile.PrecompileError as error:
                cells[f"{{name}} {{setting}}"] = ("refused", str(error), want if isinstance(want, str) else "")
                continue
            except RuntimeError as error:
                got = "raises: " + str(error)
        if isinstance(got, str) or isinstance(want, str):
            cells[f"{{name}} {{setting}}"] = ("same" if got == want else "differs", got, want if isinstance(want, str) else "value")
        else:
            exact = torch.equal(got, want)
            close = torch.allclose(got.float(), want.float(), atol=1e-2, rtol=1e-2)
            cells[f"{{name}} {{setting}}"] = ("exact" if exact else "close" if close else "wrong", "", "")
print(json.dumps(cells))
"""


SETTINGS = ("ordinary", "math", "efficient", "ordinary again")


@pytest.mark.parametrize(
    ("tracer", "backend"),
    [("make_fx", "eager"), ("make_fx", "inductor"), ("dynamo", "eager"), ("dynamo", "inductor")],
)
def test_attention_backend_flags_are_checked_where_the_artifact_holds_the_kernel(
    tmp_path: Path, tracer: str, backend: str
) -> None:
    (tmp_path / "kmodels.py").write_text(MODELS)
    run_json(CAPTURE.format(tracer=tracer, backend=backend), cwd=tmp_path, pythonpath=[tmp_path])
    cells = run_json(SERVE.format(), cwd=tmp_path, pythonpath=[tmp_path])
    # fn choosing its kernel itself (``with sdpa_kernel(MATH)`` inside) computes the math
    # composition under any caller's flags. Served in an unchanged fresh process: its
    # trace went through torch.nn.attention, a package that by then also held the
    # submodules imported at capture (``flex_attention``), names its code never reads and
    # a fresh process lacks; Dynamo's artifact held that binding against the load.
    own = {setting: cells[f"own {setting}"] for setting in SETTINGS}
    assert own["ordinary"][0] == "exact", own
    assert own["ordinary again"][0] == "exact", own
    for setting in ("math", "efficient"):
        if (tracer, backend) == ("dynamo", "eager"):
            assert own[setting][0] == "exact", own
        else:  # the caller's flags are compared at the call: a refusal, never another kernel
            assert own[setting][0] in {"exact", "refused"}, own
    for name in ("attn", "aten", "mha"):
        # nn.MultiheadAttention takes its fused fast path in eager (not while make_fx or
        # Dynamo traces): the artifact computes its composition, float32-close, and
        # exact to eager under torch.backends.mha.set_fastpath_enabled(False).
        served = {"exact", "close"} if name == "mha" else {"exact"}
        assert cells[f"{name} ordinary"][0] in served, cells
        assert cells[f"{name} ordinary again"][0] in served, cells
        math, efficient = cells[f"{name} math"], cells[f"{name} efficient"]
        if (tracer, backend) == ("dynamo", "eager"):
            # Its graph calls the attention under the call's flags, as eager does.
            assert math[0] in served, math
            if name != "mha":
                assert efficient[0] == "same", efficient  # eager's own error
            else:  # eager's fast path needs no SDPA backend; the traced path does
                assert efficient[1].startswith("raises: No viable backend"), efficient
            continue
        for kind, message, _ in (math, efficient):
            assert kind == "refused", (math, efficient)
            assert "scaled_dot_product_attention's kernel switch" in message, message
            assert "kmodels.py:" in message, message  # the user's line that led to it
        # Under MATH the fused kernel's flag is the setting named first (not cuDNN's,
        # which CPU never reads), the others after it.
        assert "kernel switch torch.backends.cuda.flash_sdp_enabled()" in math[1], math
        if name != "mha":  # eager has no backend under EFFICIENT_ATTENTION alone
            assert efficient[2].startswith("raises: No viable backend"), efficient
