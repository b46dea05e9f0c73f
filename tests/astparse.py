"""``ast.parse`` for the tests that read our source (lints), safe beside threads that compile code.

CPython 3.11 keeps the AST constructor's recursion counter per interpreter, not per thread: when
another thread compiles code at the same moment (a hub run in a thread importing a module), the
parse can fail with ``SystemError: AST constructor recursion depth mismatch`` (CPython gh-106905;
seen once in a full run). The source is not at fault and a second parse reads it; any other error,
or the same one five times over, is raised.
"""

from __future__ import annotations

import ast


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    for attempt in range(5):
        try:
            return ast.parse(source, filename)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc) or attempt == 4:
                raise
    raise AssertionError("unreachable")
