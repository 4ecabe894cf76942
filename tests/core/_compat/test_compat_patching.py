"""``_compat.patching.patched``: every capture patch of a torch function goes through it,
so what it restores (also after an error, also an inherited descriptor) is what torch is
left with after every capture."""

from __future__ import annotations

import threading

import pytest

from precompile._compat.patching import patched


class Base:
    def method(self) -> str:
        return "base"

    @staticmethod
    def static() -> str:
        return "static"


class Child(Base):
    def own(self) -> str:
        return "own"


def test_the_original_is_back_after_the_block_and_after_an_error() -> None:
    original = vars(Child)["own"]
    with patched(Child, "own", lambda self: "patched"):
        assert Child().own() == "patched"
    assert vars(Child)["own"] is original
    with pytest.raises(ValueError), patched(Child, "own", lambda self: "patched"):
        raise ValueError("inside the block")
    assert vars(Child)["own"] is original and Child().own() == "own"


def test_an_inherited_attribute_is_deleted_again_not_copied_down() -> None:
    with patched(Child, "method", lambda self: "patched"):
        assert Child().method() == "patched" and Base().method() == "base"
    assert "method" not in vars(Child)
    assert Child().method() == "base"


def test_a_static_method_is_restored_as_the_descriptor_it_was() -> None:
    descriptor = vars(Base)["static"]
    with patched(Base, "static", staticmethod(lambda: "patched")):
        assert Base.static() == "patched"
    assert vars(Base)["static"] is descriptor and Base().static() == "static"


def test_nested_patches_unwind_in_order() -> None:
    with patched(Child, "own", lambda self: "outer"):
        with patched(Child, "own", lambda self: "inner"):
            assert Child().own() == "inner"
        assert Child().own() == "outer"
    assert Child().own() == "own"


def test_a_second_thread_waits_until_the_first_restores() -> None:
    """Two threads capturing at once must not restore each other's patch: the second
    patches only after the first's block ends."""
    entered = threading.Event()
    release = threading.Event()
    seen: list[str] = []

    def first() -> None:
        with patched(Child, "own", lambda self: "first"):
            entered.set()
            release.wait(5)
            seen.append(Child().own())

    def second() -> None:
        entered.wait(5)
        with patched(Child, "own", lambda self: "second"):
            seen.append(Child().own())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    entered.wait(5)
    # The second thread has had time to patch if nothing stopped it: it must not have.
    threads[1].join(0.2)
    assert threads[1].is_alive() and seen == [] and Child().own() == "first"
    release.set()
    for t in threads:
        t.join(10)
    assert seen == ["first", "second"]
    assert Child().own() == "own"
