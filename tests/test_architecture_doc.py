"""docs/architecture.md names where each piece lives: every path it names must exist, so that a module
moved or removed is not left behind in the map a newcomer reads first (issue 34, "docs drift").

A path is a backticked token under one of the tree's top-level directories (``module.attribute`` names
its module). On a line, a bare file name after paths (`storage/orgs.py`, `tokens.py`) is in one
of their directories, as the table writes it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
TOP = ("hub", "actors", "storage", "webrtc", "device_client", "tests", "bench", "docs", "console", ".ci")
TOKEN = re.compile(r"`([^`\s]+)`")
FILE = re.compile(r"^[\w.-]+\.(py|sql|md|toml|js|html|css|json|sh)$")


def named_paths(text: str) -> list[tuple[int, list[str]]]:
    """(line number, candidates) for every path the doc names: one candidate for a path, and for a bare
    file name each directory named before it on the same line (it must be in one of them)."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        dirs: list[str] = []
        for token in TOKEN.findall(line):
            token = token.split(" ")[0].rstrip(",.;:")
            if "<" in token:
                continue  # a pattern the text explains (hub/api/<resource>.py)
            if "/" in token and token.split("/")[0] in TOP:
                head, _, last = token.rpartition("/")
                if last and "." in last and not FILE.match(last) and not any(c in last for c in "*?["):
                    token = f"{head}/{last.split('.')[0]}.py"  # module.attribute: the module
                found.append((number, [token]))
                dirs.append(token if token.endswith("/") else head + "/")
            elif dirs and FILE.match(token):
                found.append((number, [d + token for d in dirs]))
            elif dirs and re.match(r"^[\w.-]+/$", token):  # a subdirectory of one of them (`static/`)
                found.append((number, [d + token for d in dirs]))
                dirs += [d + token for d in dirs]
    return found


def exists(path: str) -> bool:
    if any(ch in path for ch in "*?["):
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def test_every_path_the_architecture_doc_names_exists():
    paths = named_paths(DOC.read_text())
    assert len(paths) > 100  # the map names the tree, not a handful of files
    missing = [f"line {n}: {' or '.join(c)}" for n, c in paths if not any(exists(p) for p in c)]
    assert missing == [], "docs/architecture.md names paths that do not exist:\n" + "\n".join(missing)


def test_a_bare_file_name_is_one_of_its_neighbours_siblings():
    line = "| `storage/orgs.py`, `tokens.py`, `hub/x/`, `y.py` | `hub/a/b.Thing` |"
    assert [c for _, c in named_paths(line)] == [
        ["storage/orgs.py"], ["storage/tokens.py"], ["hub/x/"], ["storage/y.py", "hub/x/y.py"], ["hub/a/b.py"]]
    assert named_paths("`z.py` alone names nothing") == []
