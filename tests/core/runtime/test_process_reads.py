"""What a traced function asks the process rather than its arguments: each is refused,
at capture or per call, never served with the capture's answer.

Found by attack (session 27), each served as traced before: make_fx baked the clock
(``time.time()``, ``datetime.now()``), the process and thread id, a file's text, the
working directory, ``os.urandom`` and ``hash()`` of a string into its graph; Dynamo
folded ``hash("...")`` (seeded per process), ``hash(obj)`` and ``id(obj)`` unguarded;
Dynamo guarded nothing of what ``os.getenv`` read (it skips the guards of the
standard library's globals); and Dynamo guarded nothing where
a dict lookup raised ``KeyError`` that the traced code caught (``try: CFG["k"] except
KeyError``, a ``Mapping.get``, ``os.environ.get``), so a process holding the key was
served the branch of its absence; and both tracers served the absence of a name a
project module did not bind at capture, looked up by string (``getattr(cfg, "K", d)``,
``hasattr(cfg, "K")``), after the module bound it. make_fx served the capture's ``Decimal`` arithmetic
under any precision the caller set (``decimal``'s current context).
"""

from __future__ import annotations

import decimal
import gc
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from precompile import PrecompileError
from tests.fixtures import process_reads as pr
from tests.harness import capture_pair, run_json

X = torch.arange(1.0, 5.0)


def _capture(fn: Any, directory: Path, name: str, tracer: Any, backend: str = "eager") -> Any:
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return capture_pair(fn, X, directory=directory, name=name, tracer=tracer, backend=backend)


@pytest.mark.parametrize("name", sorted(pr.SOURCES))
def test_make_fx_refuses_a_value_asked_of_the_process(tmp_path: Path, name: str) -> None:
    target = tmp_path / "scale.txt"
    target.write_text("2")
    pr.FILE[:] = [str(target)]
    fn, call, what = pr.SOURCES[name]
    with pytest.raises(PrecompileError) as raised:
        _capture(fn, tmp_path, name, precompile.MakeFxTracer())
    message = str(raised.value)
    assert f"({call} reads {what}" in message, message
    assert "process_reads.py:" in message and "pass the answer as an argument" in message
    assert not (tmp_path / f"{name}.py").exists()


def test_the_refusal_holds_under_the_inductor_backend(tmp_path: Path) -> None:
    with pytest.raises(PrecompileError, match=r"time\.time\(\) reads the clock"):
        _capture(pr.clock, tmp_path, "clock", precompile.MakeFxTracer(), backend="inductor")


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("string_hash", "hash() of 'bucket' at"),
        ("object_hash", "hash() of a Token at"),
        ("object_id", "id() at"),
    ],
)
def test_dynamo_refuses_a_hash_or_address_it_would_fold(
    tmp_path: Path, name: str, words: str
) -> None:
    with pytest.raises(PrecompileError) as raised:
        _capture(pr.SOURCES[name][0], tmp_path, name, precompile.DynamoTracer())
    message = str(raised.value)
    assert words in message and "process_reads.py:" in message, message


SERVE = """
import decimal, json, sys, warnings
import torch
import precompile
from tests.fixtures import process_reads as pr
from tests.harness import served_or_refused
warnings.simplefilter("ignore")
X = torch.arange(1.0, 5.0)
pairs = {pairs!r}
fns = pr.SERVED
pr.set_settings()
pr.stdlib_baseline()
stores = iter(range(100))
out = {{}}

def call(label, run, name):
    out[label] = served_or_refused(lambda: run(X), lambda: fns[name](X))

for key, (name, artifact, cache) in pairs.items():
    if name in pr.LOOKUPS:
        change, undo = pr.add_keys, pr.remove_keys
    elif name == "third":
        change = lambda: setattr(decimal.getcontext(), "prec", 3)
        undo = lambda: setattr(decimal.getcontext(), "prec", 28)
    elif name == "settings":
        change = lambda: pr.set_settings(first=900)
        undo = pr.set_settings
    elif name == "distributed":
        change = lambda: pr.join_group({store!r} + str(next(stores)))
        undo = pr.leave_group
    elif name == "stdlib":
        change = lambda: sys.argv.append("--fast")  # in place: the list is the same
        undo = sys.argv.pop
    elif name == "stdlib_zone":
        change = lambda: pr.set_zone("EST+5")
        undo = lambda: pr.set_zone(pr.ZONE)
    else:
        run = precompile.load(artifact, cache)
        call(key + " in another process", run, name)
        continue
    change()
    run = precompile.load(artifact, cache)
    call(key + " cold", run, name)
    undo()
    call(key + " restored", run, name)
    change()
    call(key + " warm", run, name)
    undo()
    call(key + " restored again", run, name)
    if name == "third":
        decimal.getcontext().rounding = decimal.ROUND_UP
        call(key + " rounding", run, name)
        decimal.getcontext().rounding = decimal.ROUND_HALF_EVEN
    if name == "settings":
        pr.set_settings(seed=99)
        call(key + " seed", run, name)
        pr.set_settings()
print(json.dumps(out))
"""

#: The words a refusal of each lookup names the key with.
KEY_WORDS = {
    "missing_key": "'k'",
    "mapping_get": "'k'",
    "environ_get": pr.SCALE_VARIABLE,
    "getenv": pr.SCALE_VARIABLE,
    "getenv_present": pr.PRESENT_VARIABLE,
    "module_getattr": "SCALE",
    "module_hasattr": "FAST",
    "user_name": "`user_name`",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("process_reads")
    dynamo, make_fx = precompile.DynamoTracer(), precompile.MakeFxTracer()
    captures = [
        *((f"{name} dynamo", name, dynamo, "eager") for name in pr.LOOKUPS),
        ("missing_key dynamo inductor", "missing_key", dynamo, "inductor"),
        ("missing_key make_fx", "missing_key", make_fx, "eager"),
        ("mapping_get make_fx", "mapping_get", make_fx, "eager"),
        ("module_getattr make_fx", "module_getattr", make_fx, "eager"),
        ("module_hasattr make_fx", "module_hasattr", make_fx, "inductor"),
        ("third make_fx", "third", make_fx, "eager"),
        ("third make_fx inductor", "third", make_fx, "inductor"),
        ("settings make_fx", "settings", make_fx, "eager"),
        ("distributed make_fx", "distributed", make_fx, "eager"),
        ("distributed dynamo", "distributed", dynamo, "eager"),
        ("settings make_fx inductor", "settings", make_fx, "inductor"),
        ("clock dynamo", "clock", dynamo, "eager"),
        ("process_id dynamo", "process_id", dynamo, "eager"),
        ("stdlib make_fx", "stdlib", make_fx, "eager"),
        ("stdlib make_fx inductor", "stdlib", make_fx, "inductor"),
        ("stdlib dynamo", "stdlib", dynamo, "eager"),
        ("stdlib_zone make_fx", "stdlib_zone", make_fx, "eager"),
        ("stdlib_zone dynamo", "stdlib_zone", dynamo, "eager"),
    ]
    pr.remove_keys()
    threshold = gc.get_threshold()
    pr.set_settings()
    pairs = {}
    before = pr.stdlib_baseline()
    try:
        for i, (key, name, tracer, backend) in enumerate(captures):
            fn = pr.SERVED[name]
            pairs[key] = (name, *_capture(fn, directory, f"c{i}", tracer, backend))
    finally:
        os.environ.pop(pr.PRESENT_VARIABLE, None)
        gc.set_threshold(*threshold)
        pr.restore_stdlib(before)
    store = str(directory / "store")
    return dict(run_json(SERVE.format(pairs=pairs, store=store)))


LOOKUP_KEYS = [
    *(f"{name} dynamo" for name in pr.LOOKUPS),
    "missing_key dynamo inductor",
    "missing_key make_fx",
    "mapping_get make_fx",
    "module_getattr make_fx",
    "module_hasattr make_fx",
]


def _assert_checked(served: dict[str, Any], key: str, *words: str) -> None:
    """The change of ``key``'s cells refused before load ("cold") and after a served
    call ("warm"), each refusal containing ``words``; served exactly once undone."""
    for when in ("restored", "restored again"):
        assert served[f"{key} {when}"] == ["served", True], (key, when, served[f"{key} {when}"])
    for when in ("cold", "warm"):
        outcome, message = served[f"{key} {when}"]
        assert outcome == "refused", (key, when, message)
        assert all(word in message for word in words), (key, when, message)


@pytest.mark.parametrize("key", LOOKUP_KEYS)
def test_a_key_a_lookup_did_not_find_is_checked(served: dict[str, Any], key: str) -> None:
    """Added before load or after a served call: refused, naming the key; removed
    again: served exactly."""
    _assert_checked(served, key, KEY_WORDS[key.split()[0]])


@pytest.mark.parametrize(
    "name", ["environ_get", "getenv", "getenv_present", "user_name", "executable_found"]
)
def test_make_fx_refuses_the_environment_at_capture(tmp_path: Path, name: str) -> None:
    """Read directly or through the standard library's wrappers (getpass, shutil)."""
    fn = pr.LOOKUPS.get(name, pr.executable_found)
    with pytest.raises(PrecompileError, match="fn reads the process environment"):
        _capture(fn, tmp_path, name, precompile.MakeFxTracer())


@pytest.mark.parametrize("key", ["third make_fx", "third make_fx inductor"])
def test_decimal_arithmetic_is_checked_against_the_current_context(
    served: dict[str, Any], key: str
) -> None:
    """Another precision, before load or after a served call, or another rounding:
    refused, naming the context; the capture's context again: served exactly."""
    _assert_checked(served, key, "decimal.getcontext()", "prec=3")
    outcome, message = served[f"{key} rounding"]
    assert outcome == "refused" and "rounding=ROUND_UP" in message, message


def test_dynamo_refuses_decimal_arithmetic_at_capture(tmp_path: Path) -> None:
    with pytest.raises(PrecompileError, match="the capture is incomplete"):
        _capture(pr.third, tmp_path, "third", precompile.DynamoTracer())
    assert decimal.getcontext().prec == 28


@pytest.mark.parametrize("key", ["clock dynamo", "process_id dynamo"])
def test_dynamo_refuses_the_capture_s_clock_and_process_in_another(
    served: dict[str, Any], key: str
) -> None:
    outcome, message = served[f"{key} in another process"]
    assert outcome == "refused" and "the value the capture specialized on" in message, message


@pytest.mark.parametrize("key", ["settings make_fx", "settings make_fx inductor"])
def test_process_settings_fn_branches_on_are_checked_per_call(
    served: dict[str, Any], key: str
) -> None:
    """gc.get_threshold(), changed before load or after a served call, and
    torch.initial_seed(): refused, naming the setting; as captured: served exactly."""
    _assert_checked(served, key, "gc.get_threshold()", "900")
    outcome, message = served[f"{key} seed"]
    assert outcome == "refused" and "torch.initial_seed()" in message, message


@pytest.mark.parametrize("key", ["distributed make_fx", "distributed dynamo"])
def test_whether_a_process_group_is_up_is_checked_per_call(
    served: dict[str, Any], key: str
) -> None:
    """torch.distributed.is_initialized(), captured with no process group and served
    under one (joined before load, or after a served call): refused by both tracers
    (Dynamo folded it into a constant guarded by nothing); left again: served."""
    _assert_checked(served, key, "torch.distributed.is_initialized()")


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("stdlib make_fx", ("global argv of module sys", "'--fast'")),
        ("stdlib make_fx inductor", ("global argv of module sys", "'--fast'")),
        ("stdlib dynamo", ("sys.argv",)),
        ("stdlib_zone make_fx", ("global timezone of module time", "18000")),
        ("stdlib_zone dynamo", ("time.timezone",)),
    ],
)
def test_data_a_standard_library_module_holds_is_checked_per_call(
    served: dict[str, Any], key: str, words: tuple[str, ...]
) -> None:
    """``sys.argv`` grown in place and ``time.timezone`` rebound by ``tzset``, before
    load or after a served call: refused, naming the value (make_fx baked both: it
    checked the data of project modules only); as captured: served exactly."""
    _assert_checked(served, key, *words)


FLAG_SERVE = """
import json, sys, warnings
import torch
import precompile
from tests.fixtures import process_reads as pr
from tests.harness import served_or_refused
warnings.simplefilter("ignore")
X = torch.arange(1.0, 5.0)
out = {{"flag": sys.flags.dont_write_bytecode}}
for tracer, (artifact, cache) in {pairs!r}.items():
    run = precompile.load(artifact, cache)
    out[tracer] = served_or_refused(lambda: run(X), lambda: pr.bytecode_flag(X))
print(json.dumps(out))
"""


def test_a_field_of_sys_flags_is_checked_in_another_process(tmp_path: Path) -> None:
    """``sys.flags.dont_write_bytecode``: Dynamo's capture failed with a PicklingError
    (it kept the struct sequence as a guard's expected value), make_fx served the
    capture's flag in a process started with the other one. Now a process started with
    the same flags is served exactly, one started with the other is refused, naming it."""
    pairs = {
        "make_fx": _capture(pr.bytecode_flag, tmp_path, "fx", precompile.MakeFxTracer()),
        "dynamo": _capture(pr.bytecode_flag, tmp_path, "dy", precompile.DynamoTracer()),
    }
    code = FLAG_SERVE.format(pairs=pairs)
    same = "1" if sys.flags.dont_write_bytecode else ""
    other = "" if same else "1"
    served = run_json(code, PYTHONDONTWRITEBYTECODE=same)
    refused = run_json(code, PYTHONDONTWRITEBYTECODE=other)
    assert served["flag"] == sys.flags.dont_write_bytecode != refused["flag"]
    # make_fx names the struct sequence it read whole, Dynamo the field it guarded.
    words = {"make_fx": "global flags of module sys", "dynamo": "sys.flags.dont_write_bytecode"}
    for tracer in pairs:
        assert served[tracer] == ["served", True], (tracer, served[tracer])
        outcome, message = refused[tracer]
        assert outcome == "refused" and words[tracer] in message, (tracer, message)


READS_SERVE = """
import io, json, os, sys, warnings
import torch
import precompile
from tests.fixtures import process_reads as pr
from tests.harness import served_or_refused
warnings.simplefilter("ignore")
X = torch.arange(1.0, 5.0)
pr.stdlib_baseline()
runs = {{name: precompile.load(*pair) for name, pair in {pairs!r}.items()}}
out = {{}}

def call(label, name):
    out[label] = served_or_refused(lambda: runs[name](X), lambda: getattr(pr, name)(X))

sys.path.append("/nonexistent")
call("joined, sys.path grown", "joined")
join = os.path.join
os.path.join = lambda *parts: "/".join(parts) + "/"  # as mock.patch would
call("joined, os.path.join replaced", "joined")
os.path.join = join
call("joined, restored", "joined")
call("local_import", "local_import")
sys.argv.append("--fast")
call("local_import, argv grown", "local_import")
call("frozen", "frozen")
sys.frozen = True
call("frozen, now frozen", "frozen")
del sys.frozen
call("frozen, no longer", "frozen")
sys.stdout = io.StringIO()
call("prints", "prints")
call("prints, again", "prints")
sys.stdout = sys.__stdout__
print(json.dumps(out))
"""


def test_what_is_read_off_a_standard_library_module_is_checked_and_nothing_else(
    tmp_path: Path,
) -> None:
    """make_fx records what project code reads off the module itself: not ``sys.path``
    for an ``os.path.join`` (served after ``sys.path`` grew), but the function itself
    (refused once replaced, as ``mock.patch`` would); ``sys.argv`` through an
    import inside fn (refused once grown); ``getattr(sys, "frozen", False)`` of a name
    ``sys`` does not bind (refused once bound, served again once deleted); and not
    ``sys.stdout``, whose buffer every write changes (a forward that prints stays
    served)."""
    names = ["joined", "local_import", "frozen", "prints"]
    before = pr.stdlib_baseline()
    try:
        pairs = {
            name: _capture(getattr(pr, name), tmp_path, name, precompile.MakeFxTracer())
            for name in names
        }
    finally:
        pr.restore_stdlib(before)
    served = run_json(READS_SERVE.format(pairs=pairs))
    for label in [
        "joined, sys.path grown",
        "joined, restored",
        "local_import",
        "frozen",
        "frozen, no longer",
        "prints",
        "prints, again",
    ]:
        assert served[label] == ["served", True], (label, served[label])
    for label, words in [
        ("joined, os.path.join replaced", "global join of module posixpath"),
        ("local_import, argv grown", "global argv of module sys"),
        ("frozen, now frozen", "frozen"),
    ]:
        outcome, message = served[label]
        assert outcome == "refused" and words in message, (label, message)
