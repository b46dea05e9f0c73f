"""Building the app survives CPython 3.11's spurious AST error (python/cpython#106905) and nothing else."""

from __future__ import annotations

import pytest

import hub.app


def test_a_spurious_ast_error_builds_the_app_again_and_any_other_error_is_raised(monkeypatch):
    calls = []

    def flaky(services):
        calls.append(services)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=204, after=61)")
        return "app"

    monkeypatch.setattr(hub.app, "_build_app", flaky)
    assert hub.app.create_app("services") == "app" and len(calls) == 2

    def broken(services):
        raise SystemError("something else")

    monkeypatch.setattr(hub.app, "_build_app", broken)
    with pytest.raises(SystemError, match="something else"):
        hub.app.create_app("services")

    def always(services):
        raise SystemError("AST constructor recursion depth mismatch (before=1, after=2)")

    monkeypatch.setattr(hub.app, "_build_app", always)
    with pytest.raises(SystemError):  # bounded: the third failure is the caller's
        hub.app.create_app("services")
