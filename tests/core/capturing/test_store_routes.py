"""A make_fx trace that stores into the user's state is refused and the state put back,
whichever route the trace took to it: every project module's globals are walked before
the trace (``capturing/user_state.py``). The routes here are those by which an attack
got past a capture that walked only the modules fn and its arguments lead to, and those
such a narrowing has to follow: an import inside fn of a module already imported,
``sys.modules`` (also through ``getattr``), ``importlib.import_module`` (also under
another name), a module named in a string (also a computed one), the stack, a kernel
torch's operator registry holds, a read-only view, a context variable, a weak registry,
code generated with ``exec``, a logging handler's buffer, another thread, and a module
imported for the first time (walked as its import ends). docs/trust.md, "What a capture
leaves in your state", says why the walk is not narrowed."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

import precompile
from tests.fixtures.store_routes import entry, holders, ledger, opdefs, sinks
from tests.harness import capture_pair

#: What ``entry._stack_owner`` looks for: this module's globals, reached only by the stack.
ROUTES_MARK = True
CALLS: list[object] = []


def _stored() -> list[object]:
    """Everything a route may have stored into, as plain values."""
    return [
        *ledger.CALLS,
        *ledger.SEEN,
        *ledger.COUNTS,
        *opdefs.CALLS,
        *CALLS,
        *holders._STATE["seen"],
        *sinks.RECORDED,
        *sinks.AUDIT,
        *sinks.RECORDS,
        *sinks.COUNTS,
    ]


@pytest.fixture(autouse=True)
def _empty() -> None:
    for held in (ledger.CALLS, ledger.SEEN, opdefs.CALLS, CALLS, holders._STATE["seen"]):
        held.clear()
    for held in (sinks.RECORDED, sinks.AUDIT, sinks.RECORDS):
        held.clear()
    ledger.COUNTS.clear()
    sinks.COUNTS.clear()


ROUTES = [
    "by_import_inside",
    "by_sys_modules",
    "by_getattr_of_sys",
    "by_import_module",
    "by_an_alias_of_import_module",
    "by_a_name_in_a_string",
    "by_a_computed_name",
    "by_a_frame",
    "by_a_registered_kernel",
    "through_a_view",
    "through_a_context_variable",
    "through_a_weak_registry",
    "through_generated_code",
    "through_a_logging_handler",
    "on_another_thread",
]


@pytest.mark.parametrize("route", ROUTES)
def test_a_store_by_any_route_is_refused_and_put_back(tmp_path: Path, route: str) -> None:
    """The trace stores into a module fn's module does not name; the capture refuses
    (an artifact would not repeat the store: eager appends at every call, the artifact
    never) and the state holds what it held before."""
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(3, 4)
    logging.getLogger(holders.LOGGER_NAME).setLevel(logging.INFO)
    with torch.no_grad(), pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(getattr(entry, route), model, x, directory=tmp_path)
    assert "changed state in Python while it was traced" in str(refused.value), str(refused.value)
    assert _stored() == []


@pytest.mark.parametrize("route", ["by_a_registered_kernel", "through_a_view"])
def test_a_store_is_refused_before_inductor_compiles(tmp_path: Path, route: str) -> None:
    """The refusal comes from the trace, whichever backend was asked for."""
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(3, 4)
    with torch.no_grad(), pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(getattr(entry, route), model, x, directory=tmp_path, backend="inductor")
    assert "changed state in Python while it was traced" in str(refused.value)
    assert _stored() == []


def test_a_module_imported_for_the_first_time_is_walked_as_its_import_ends(
    tmp_path: Path,
) -> None:
    """fn imports a module whose top level runs its own function: the module is walked
    once its import ends, and the store after it is refused and put back."""
    name = "tests.fixtures.store_routes.fresh"
    sys.modules.pop(name, None)
    vars(sys.modules["tests.fixtures.store_routes"]).pop("fresh", None)
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(3, 4)
    with torch.no_grad(), pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(entry.by_first_import, model, x, directory=tmp_path)
    assert f"module {name}: CALLS" in str(refused.value), str(refused.value)
    assert sys.modules[name].CALLS == []


def test_a_read_of_a_modules_own_dunder_global_is_no_store(tmp_path: Path) -> None:
    """fn reads ``__name__``: the side-effect snapshot leaves the import system's
    globals out, and compared the missing entry as a change (a needless refusal, found
    by the ``sys.modules`` route above)."""
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(3, 4)
    with torch.no_grad():
        artifact, cache = capture_pair(entry.reading_its_name, model, x, directory=tmp_path)
        served = precompile.load(artifact, cache)(model, x)
        assert torch.equal(served, entry.reading_its_name(model, x))
