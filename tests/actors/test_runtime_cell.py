"""The actor runtime is one cell with a thin public face (issue 34 item 5, as trio's ``_core``).

Inside actors/_runtime/ the modules share each other's internals by design (``tasks._crashed``,
``actor._needs_start``). Outside it no module of hub/ or actors/ reads or writes another object's
private field: ``x._name`` is flagged unless ``x`` is ``self``, ``cls`` or ``super()``, or ``_name``
is defined in the same module (a module is the smallest cell: Python's own convention). The
third-party objects whose private API we use, and the accesses other parts of issue 34 remove, are
listed below with a reason; a listed access that no longer exists fails too: delete its line then.
That only actors/runtime.py imports the cell is .importlinter's runtime-cell contract.
"""

from __future__ import annotations

import ast
from pathlib import Path
from tests.astparse import parse

ROOT = Path(__file__).resolve().parents[2]
CELL = ROOT / "actors" / "_runtime"

# (module, the access as written) -> why it stays
KNOWN = {
    # third-party objects: their private API is what the library documents or what we must reach
    ("hub/admin_args.py", "command._actions"): "argparse: the sub-commands' help lists its actions",
    ("hub/answers.py", "provider._prepare_response_obj"): "quart's JSON provider, overridden for orjson",
    ("hub/api/tunnels.py", "websocket._get_current_object"): "werkzeug's LocalProxy, documented",
    ("hub/auth/authz.py", "g._get_current_object"): "werkzeug's LocalProxy, documented",
    ("hub/auth/middleware.py", "request._get_current_object"): "werkzeug's LocalProxy, documented",
    ("hub/auth/middleware.py", "g._get_current_object"): "werkzeug's LocalProxy, documented",
    ("hub/mcp/endpoint.py", "self.manager._server_instances"): "the MCP SDK's one record of open sessions",
    ("hub/mcp/endpoint.py", "manager._lifespan_state"): "what the MCP SDK's manager passes its "
                                                             "single-exchange entry, which the endpoint calls",
    ("hub/mcp/answers.py", "single_exchange._write"): "the MCP SDK's single-exchange JSON writer, "
                                                        "wrapped to write results with orjson (answer_writer)",
    ("hub/mcp/answers.py", "single_exchange._sse_event"): "the MCP SDK's single-exchange SSE framer, "
                                                            "wrapped to write results with orjson (event_framer)",
}


def _private(name: str) -> bool:
    # dunders are Python's, sunders (``_value2member_map_``) an enum's public API
    return name.startswith("_") and not name.endswith("_")


def _defined_private_names(tree: ast.AST) -> set[str]:
    """The private names this module defines: functions, classes, names it binds, ``self._x = ...``,
    ``__slots__`` entries (``other._x = ...`` defines nothing: it is the access this lint is about)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_own(node.value):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                for t in node.targets):
            names |= {c.value for c in ast.walk(node.value)
                      if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return {n for n in names if _private(n)}


def _is_own(value: ast.expr) -> bool:
    if isinstance(value, ast.Name) and value.id in ("self", "cls"):
        return True
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def foreign_private_accesses(source: str) -> list[tuple[int, str]]:
    """``x._name`` where ``x`` is another object and ``_name`` is not this module's own."""
    tree = parse(source)
    own = _defined_private_names(tree)
    return sorted({(node.lineno, ast.unparse(node)) for node in ast.walk(tree)
                   if isinstance(node, ast.Attribute) and _private(node.attr)
                   and node.attr not in own and not _is_own(node.value)})


def _modules_outside_the_cell() -> list[Path]:
    paths = [*ROOT.glob("hub/**/*.py"), *ROOT.glob("actors/**/*.py")]
    return sorted(p for p in paths if CELL not in p.parents)


def test_nothing_outside_the_runtime_cell_touches_another_objects_private_field():
    found = set()
    for path in _modules_outside_the_cell():
        rel = path.relative_to(ROOT).as_posix()
        for line, access in foreign_private_accesses(path.read_text()):
            found.add((rel, access, line))
    unexpected = sorted(f"{rel}:{line}: {access}" for rel, access, line in found if (rel, access) not in KNOWN)
    assert unexpected == []
    gone = sorted(KNOWN.keys() - {(rel, access) for rel, access, _ in found})
    assert gone == [], "these accesses no longer exist: delete their lines from KNOWN"


def test_the_lint_flags_what_the_cell_did_before_it_was_one():
    # what actors/runtime.py did to actors/background.py's ActorTasks while they were two modules
    before = "class Actor:\n    def run(self):\n        tasks = self.tasks\n        if tasks._crashed is None:\n" \
             "            tasks._loop = None\n        self._supervisor._wake(self)\n"
    assert [a for _, a in foreign_private_accesses(before)] == ["tasks._crashed", "tasks._loop",
                                                                 "self._supervisor._wake"]
    # its own fields, super()'s, and a name this module defines are not foreign
    own = "class Sub:\n    _seen = 0\n    def f(self, other):\n        super()._g()\n        return other._seen\n"
    assert foreign_private_accesses(own) == []


def _cell_actor_private_names() -> set[str]:
    tree = parse((CELL / "actor.py").read_text())
    actor = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Actor")
    return _defined_private_names(actor)


def runtime_fields_used(source: str, runtime_names: set[str]) -> list[str]:
    """What an Actor subclass in ``source`` does with the runtime's own private names."""
    found = []
    for cls in (n for n in ast.walk(parse(source)) if isinstance(n, ast.ClassDef)):
        if not any(isinstance(b, ast.Name) and b.id == "Actor" for b in cls.bases):
            continue
        found += [f"{node.lineno}: {cls.name} uses self.{node.attr}" for node in ast.walk(cls)
                  if isinstance(node, ast.Attribute) and _is_own(node.value) and node.attr in runtime_names]
        found += [f"{node.lineno}: {cls.name} defines {node.name}" for node in cls.body
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in runtime_names]
    return found


def test_no_actor_outside_the_cell_uses_the_runtimes_own_fields():
    # a subclass's self._mailbox or self._loop would read, or silently replace, the runtime's own state
    runtime_names = _cell_actor_private_names()
    assert {"_mailbox", "_needs_start", "_awake", "_supervisor", "_loop", "_park"} <= runtime_names
    found = [f"{path.relative_to(ROOT)}:{where}" for path in _modules_outside_the_cell()
             for where in runtime_fields_used(path.read_text(), runtime_names)]
    assert found == []
    clash = "class Poller(Actor):\n    async def _loop(self):\n        self._awake = True\n        self._pending = {}\n"
    assert runtime_fields_used(clash, runtime_names) == ["3: Poller uses self._awake", "2: Poller defines _loop"]
