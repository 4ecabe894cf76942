"""The product as users get it: a wheel built from the checkout, installed into a fresh
venv, run from a folder with no source tree on ``sys.path``.

Every other test imports the editable install, which maps the source folders whole, so a
package the wheel leaves out (``precompile._compat`` once was) goes unnoticed there. The
fresh venv sees the test venv's third-party packages (torch, pygls, ...) through a path
entry -- installing torch again would take minutes and need the network -- but not its
editable install of this project (a path entry's ``.pth`` files are not processed), and
``pip check`` confirms that what the wheel declares it needs is there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: A tiny workspace: one target, captured with make_fx and emitted by ``check --emit``.
_TARGET = """
import torch
import precompile


def examples():
    return [precompile.Example(torch.nn.Linear(4, 2).eval(), torch.randn(3, 4))]


@precompile.target(examples, tracer="make_fx", artifact="artifacts/head.py")
def head(model, x):
    return torch.relu(model(x))
"""

_SERVE = """
import json, sys, torch, precompile, precompile.capture_api, precompile._compat
from precompile_lsp import doclinks
from models import head

model = torch.nn.Linear(4, 2).eval()
x = torch.randn(5, 4)
with precompile.capture(head, artifact_path="direct.py", cache_path="direct.cache",
                       tracer=precompile.MakeFxTracer()) as cap:
    cap(model, torch.randn(5, 4))
served = precompile.load("artifacts/head.py")(model, torch.randn(3, 4))
print(json.dumps({
    "precompile": precompile.__file__,
    "docs_page": doclinks.DIAGNOSTICS.is_file(),
    "served_shape": list(served.shape),
}))
"""

_LOAD_DIRECT = """
import json, torch, precompile
torch.manual_seed(0)
model = torch.nn.Linear(4, 2).eval()
x = torch.randn(5, 4)
out = precompile.load("direct.py", "direct.cache")(model, x)
print(json.dumps({"same": bool(torch.equal(out, torch.relu(model(x)))), "file": precompile.__file__}))
"""


def _tracked_copy(destination: Path) -> Path:
    """The checkout's files as a fresh clone has them (symlinks kept), without build
    outputs or the test venv."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False)
    assert listed.returncode == 0, f"git ls-files failed in {REPO}: {listed.stderr!r}"
    for name in listed.stdout.decode().split("\0"):
        if not name:
            continue
        source, target = REPO / name, destination / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree, not yet committed
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return destination


def _fresh_env(home: Path) -> dict[str, str]:
    """The environment of a user's shell: nothing of this checkout on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["HOME"] = str(home)
    env["PATH"] = os.pathsep.join([str(home / "venv" / "bin"), env.get("PATH", "")])
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh venv with the wheel built from a copy of the checkout installed."""
    root = tmp_path_factory.mktemp("wheel")
    source = _tracked_copy(root / "source")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(root / "dist"), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    assert "BuildBackendWarning" not in built.stderr, built.stderr
    (wheel,) = (root / "dist").glob("torch_precompile-*.whl")

    venv.create(root / "venv", with_pip=True, symlinks=True)
    python = root / "venv" / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # torch and the other dependencies, from the test venv (no .pth of it is processed).
    Path(site, "test-venv-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = _fresh_env(root)
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return root, env


def test_the_wheel_declares_every_package_and_its_dependencies_are_met(
    installed: tuple[Path, dict[str, str]],
) -> None:
    root, env = installed
    python = str(root / "venv" / "bin" / "python")
    check = subprocess.run(
        [python, "-m", "pip", "check"], capture_output=True, text=True, env=env, check=False
    )
    # Only this distribution's requirements matter (the borrowed site-packages may
    # hold packages with needs of their own).
    ours = [line for line in check.stdout.splitlines() if line.startswith("torch-precompile")]
    assert not ours, check.stdout
    imported = subprocess.run(
        [python, "-c", "import pkgutil, precompile, precompile_lsp; "
         "print('\\n'.join(m.name for m in pkgutil.walk_packages(precompile.__path__, 'precompile.')))"],
        capture_output=True, text=True, env=env, cwd=root, check=False,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    shipped = set(imported.stdout.split())
    in_source = {
        "precompile." + ".".join(p.relative_to(REPO / "core" / "precompile").with_suffix("").parts)
        for p in (REPO / "core" / "precompile").rglob("*.py")
        if p.name != "__init__.py"
    }
    assert in_source <= shipped, f"left out of the wheel: {sorted(in_source - shipped)}"


def test_capture_load_and_check_emit_verify_run_from_the_installed_wheel(
    installed: tuple[Path, dict[str, str]],
) -> None:
    root, env = installed
    python = str(root / "venv" / "bin" / "python")
    workspace = root / "workspace"
    workspace.mkdir()
    (workspace / "models.py").write_text(textwrap.dedent(_TARGET))
    (workspace / "pyproject.toml").write_text("[tool.precompile]\n")

    check = subprocess.run(
        [str(root / "venv" / "bin" / "precompile"), "check", "--emit", "--verify",
         "--format", "json"],
        cwd=workspace, capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert (workspace / "artifacts" / "head.py").is_file()

    served = subprocess.run(
        [python, "-c", _SERVE], cwd=workspace, capture_output=True, text=True, env=env,
        timeout=600, check=False,
    )  # fmt: skip
    assert served.returncode == 0, served.stderr
    result = json.loads(served.stdout.strip().splitlines()[-1])
    assert Path(result["precompile"]).is_relative_to(root / "venv"), result
    assert result["docs_page"] and result["served_shape"] == [3, 2]

    fresh = subprocess.run(
        [python, "-c", _LOAD_DIRECT], cwd=workspace, capture_output=True, text=True,
        env=env, timeout=600, check=False,
    )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout.strip().splitlines()[-1])["same"]


_OVERWRITE = """
import torch
import precompile


def examples():
    return [precompile.Example(torch.nn.Linear(4, 2).eval(), torch.randn(3, 4))]


@precompile.target(examples, tracer="make_fx", artifact="README.md")
def head(model, x):
    return model(x)
"""

_FALLBACK = """
import json, warnings, torch, precompile
from models import head

model = torch.nn.Linear(4, 2).eval()
with precompile.capture(head, artifact_path="served.py", cache_path="served.cache",
                       tracer=precompile.MakeFxTracer()) as cap:
    cap(model, torch.randn(3, 4))
calls = []
def fallback(m, x):
    calls.append(x.shape[0])
    return head(m, x)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    run = precompile.load("served.py", "served.cache", fallback=fallback)
    x = torch.randn(7, 4)
    out = run(model, x)
print(json.dumps({
    "same": bool(torch.equal(out, head(model, x))),
    "calls": calls,
    "stats": run.stats(),
    "warned": [w.category.__name__ for w in caught],
}))
"""


def test_the_installed_wheel_keeps_the_write_policy_and_never_falls_back_silently(
    installed: tuple[Path, dict[str, str]],
) -> None:
    """Two promises, as installed from the wheel: ``check --emit`` never replaces a file
    the product did not write, and a refused call answered by the fallback is counted
    and warned of."""
    root, env = installed
    workspace = root / "attack"
    workspace.mkdir()
    readme = b"# my project\n\nhand-written, not an artifact\n"
    (workspace / "README.md").write_bytes(readme)
    (workspace / "models.py").write_text(textwrap.dedent(_OVERWRITE))
    (workspace / "pyproject.toml").write_text("[tool.precompile]\n")
    check = subprocess.run(
        [str(root / "venv" / "bin" / "precompile"), "check", "--emit", "--format", "json"],
        cwd=workspace, capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert check.returncode == 1, check.stdout + check.stderr
    codes = [f["code"] for f in json.loads(check.stdout)["findings"]]
    assert "PC305" in codes, codes
    assert (workspace / "README.md").read_bytes() == readme

    (workspace / "models.py").write_text(textwrap.dedent(_TARGET).replace("relu", "tanh"))
    served = subprocess.run(
        [str(root / "venv" / "bin" / "python"), "-c", _FALLBACK], cwd=workspace,
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert served.returncode == 0, served.stderr
    result = json.loads(served.stdout.strip().splitlines()[-1])
    assert result["same"] and result["calls"] == [7]
    assert (result["stats"]["fallback"], result["stats"]["served"]) == (1, 0)
    assert "ServingFallbackWarning" in result["warned"]


#: What the installed-wheel attack captures: a module a fresh process can import.
_ATTACK_MODELS = """
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return F.gelu(self.fc(x)) + x


def serve(model, x):
    return model(x)
"""

_ATTACK_CAPTURE = """
import sys, torch, precompile
from attack_models import Block, serve
torch.manual_seed(0)
tracers = {"make_fx": precompile.MakeFxTracer(), "dynamo": precompile.DynamoTracer()}
with torch.no_grad():
    for name, tracer in tracers.items():
        with precompile.capture(serve, artifact_path=name + ".py", cache_path=name + ".cache",
                               tracer=tracer) as cap:
            cap(Block().eval(), torch.randn(3, 4))
print(precompile.__file__)
"""

#: Each change made after load (and undone); its verdict: "served" with values equal to
#: eager's (a graph may round the last bit differently),
#: "refused" with a PrecompileError, or "wrong" (served a value eager does not give).
_ATTACK_PLAY = """
import contextlib, json, sys, warnings
warnings.simplefilter("ignore")
import torch, precompile
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from attack_models import Block, serve

class PlusOne(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out + 1 if func is torch.Tensor.__add__ else out

@contextlib.contextmanager
def patched(owner, name, value):
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)

@contextlib.contextmanager
def no_grad_flags(model):
    model.requires_grad_(False)
    try:
        yield
    finally:
        model.requires_grad_(True)

torch.manual_seed(0)
model, x = Block().eval(), torch.randn(3, 4)
changes = {
    "F.gelu patched": lambda: patched(F, "gelu", torch.tanh),
    "Tensor.__add__ patched": lambda: patched(torch.Tensor, "__add__", torch.Tensor.sub),
    "a torch function mode at call time": PlusOne,
    "default dtype float64": lambda: patched_dtype(),
    "requires_grad_(False)": lambda: no_grad_flags(model),
    "inference_mode": torch.inference_mode,
    "eval() again": lambda: contextlib.nullcontext(model.eval()),
}

@contextlib.contextmanager
def patched_dtype():
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(torch.float32)

def verdict(run, inputs):
    try:
        got = run(model, inputs)
    except precompile.PrecompileError:
        return "refused"
    want = serve(model, inputs)
    return "served" if torch.allclose(got, want, rtol=1e-5, atol=1e-6) else "wrong"

out = {}
run = precompile.load(sys.argv[1] + ".py", sys.argv[1] + ".cache")
with torch.no_grad():
    out["plain"] = verdict(run, x)
    out["an input aliasing fc.weight"] = verdict(run, model.fc.weight[:3])
    for name, change in changes.items():
        with change():
            out[name] = verdict(run, x)
        out[name + ", undone"] = verdict(run, x)
print(json.dumps(out))
"""

#: The changes serving code always makes: each must be served, not refused.
_SERVED_NO_OPS = ("requires_grad_(False)", "inference_mode", "eval() again")


def test_the_installed_wheel_refuses_what_a_trace_read_from_torch_and_serves_no_ops(
    installed: tuple[Path, dict[str, str]],
) -> None:
    """The runtime an artifact carries comes from the installed package's files: capture
    and attack from the wheel, both tracers, each change in a fresh process after load.
    A patched torch function or method, a mode active at call time, another default dtype
    and an input aliasing a parameter are refused or served equal to eager; never served
    wrong. The no-op changes serving code makes are served."""
    root, env = installed
    python = str(root / "venv" / "bin" / "python")
    workspace = root / "torch_attack"
    workspace.mkdir()
    (workspace / "attack_models.py").write_text(textwrap.dedent(_ATTACK_MODELS))
    captured = subprocess.run(
        [python, "-c", _ATTACK_CAPTURE], cwd=workspace, capture_output=True, text=True,
        env=env, timeout=600, check=False,
    )  # fmt: skip
    assert captured.returncode == 0, captured.stderr
    assert Path(captured.stdout.strip().splitlines()[-1]).is_relative_to(root / "venv")
    for tracer in ("make_fx", "dynamo"):
        played = subprocess.run(
            [python, "-c", _ATTACK_PLAY, tracer], cwd=workspace, capture_output=True,
            text=True, env=env, timeout=600, check=False,
        )  # fmt: skip
        assert played.returncode == 0, played.stderr
        out = json.loads(played.stdout.strip().splitlines()[-1])
        assert "wrong" not in out.values(), (tracer, out)
        assert all(out[k] == "served" for k in out if k == "plain" or k.endswith("undone")), (
            tracer,
            out,
        )
        assert all(out[k] == "served" for k in _SERVED_NO_OPS), (tracer, out)
