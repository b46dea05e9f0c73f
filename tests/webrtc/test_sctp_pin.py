"""webrtc/sctp.py replaces a private method of aiortc (``RTCSctpTransport._send_sack``) to batch SACKs.
It was verified (bench/tunnel.py, bench/RESULTS.md) against aiortc 1.16.0 only, which pyproject.toml
pins. These tests fail loudly the moment another aiortc is installed or the patched method, or the
way aiortc calls it, changes: re-verify the patch (its docstring says what it relies on) and its
benchmark, then update the pin and the fingerprints below."""

from __future__ import annotations

import ast
import hashlib
import tomllib
from importlib.metadata import version
from pathlib import Path

import aiortc.rtcsctptransport as sctp_module
from tests.astparse import parse

ROOT = Path(__file__).resolve().parents[2]
VERIFIED_AIORTC = "1.16.0"
# sha256 of the source of RTCSctpTransport._send_sack in the verified aiortc (the file, not the class
# attribute: the patch replaces the attribute once applied).
VERIFIED_SEND_SACK = "ac92513522fa60e7f298fd0e5849dd8b9aa9ac969cf840aa653f96c2de690d43"
HOW = ("webrtc/sctp.py patches aiortc's private RTCSctpTransport._send_sack and was verified on aiortc "
       f"{VERIFIED_AIORTC} only: re-verify the patch and bench/tunnel.py before changing the pin or this test")


def transport_class() -> ast.ClassDef:
    tree = parse(Path(sctp_module.__file__).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RTCSctpTransport")


def methods(cls: ast.ClassDef) -> dict[str, ast.AST]:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_the_installed_aiortc_is_the_verified_one_and_the_pin_says_so():
    assert version("aiortc") == VERIFIED_AIORTC, HOW
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in deps if d.startswith("aiortc")] == ["aiortc>=1.16.0,<1.17"], HOW


def test_the_patched_method_is_unchanged():
    source = Path(sctp_module.__file__).read_text()
    node = methods(transport_class())["_send_sack"]
    assert isinstance(node, ast.AsyncFunctionDef), HOW  # the patch replaces it with a coroutine function
    assert [a.arg for a in node.args.args] == ["self"] and not node.args.kwonlyargs, HOW
    text = "".join(source.splitlines(keepends=True)[node.lineno - 1:node.end_lineno])  # as inspect.getsource
    assert hashlib.sha256(text.encode()).hexdigest() == VERIFIED_SEND_SACK, HOW


def test_aiortc_still_calls_it_only_after_handling_a_packet_and_flags_it_the_same_way():
    cls = transport_class()
    callers = {name for name, fn in methods(cls).items() if name != "_send_sack"
               for n in ast.walk(fn) if isinstance(n, ast.Attribute) and n.attr == "_send_sack"}
    assert callers == {"_handle_data"}, HOW
    # the patch reads _sack_needed when its deferred SACK fires
    setters = {name for name, fn in methods(cls).items()
               for n in ast.walk(fn) if isinstance(n, ast.Attribute) and n.attr == "_sack_needed"}
    assert {"_handle_data", "_send_sack", "_receive_data_chunk"} <= setters, HOW
