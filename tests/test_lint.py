"""Pyflakes' checks hold over the tree: no unused or shadowed import, no unused local, no undefined name.

Why a test: an undefined name on a rarely taken path is a NameError in production (the error paths
are the ones a review reads least), and dead imports hid how far a module's dependencies really
reach (webrtc/client.py kept one for a year). ``ruff check --select F`` is pyflakes' rule set; ruff is
pinned to a minor version in pyproject.toml so that a new release's rules come in on purpose.

The second test shows the check can fail: a file with an undefined name is refused.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).with_name("ruff")
TREE = ("hub", "actors", "webrtc", "storage", "device_client", "tests", "bench")


def ruff(*paths: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUFF), "check", "--no-cache", "--isolated", "--select", "F",
                           "--output-format", "concise", *map(str, paths)],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_pyflakes_checks_hold_over_the_tree():
    done = ruff(*TREE)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_check_refuses_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import json\n\n\ndef f():\n    return undefined_name\n")
    done = ruff(bad, cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    assert "F821" in done.stdout and "F401" in done.stdout, done.stdout
