"""What ``fleethub`` says when a command fails: an ordinary failure (a busy port, an unknown
organisation, a database that will not start) in one line; a bug with its traceback.

Imports only the standard library: the device-side commands run where the hub's packages are not
installed. An error class is recognised by name through ``sys.modules``: a module that was never
imported cannot have raised it, so nothing here imports it to ask.
"""

from __future__ import annotations

import errno
import sys

# (module, class): the failures an operator causes or meets and can act on from the message alone.
ORDINARY = (
    ("builtins", "OSError"),  # a busy port, a missing or unreadable file, a refused connection
    ("hub.errors", "FleethubError"),  # the hub's one error tree: not found, conflict, unavailable...
    ("storage.embedded", "EmbeddedPostgresError"),
    ("storage.db", "DatabaseUnavailable"),
    ("storage.migrate", "MigrationChanged"),
    ("storage.crypto", "SecretsKeyError"),
    ("hub.auth.signing_keys", "SigningKeyError"),
    ("asyncpg.exceptions", "InvalidAuthorizationSpecificationError"),  # a wrong password in the URL
    ("asyncpg.exceptions", "InvalidCatalogNameError"),  # a database that does not exist
    ("httpx", "TransportError"),  # sim, tunnel: the hub cannot be reached
    ("httpx", "HTTPStatusError"),  # the hub refused (a wrong token, say)
    ("device_client.sim", "SimError"),  # sim: the hub would not provision the devices
    ("device_client.state", "IdentityError"),  # agent: an identity key it must not replace
    ("device_client.memtest.plan", "PlanError"),  # demo, sim: memory-test flags that do not fit
)


BIND_ERRORS = {errno.EADDRINUSE: "another process listens there",
               errno.EADDRNOTAVAIL: "not an address of this machine",
               errno.EACCES: "a port below 1024 needs privileges"}


def leaves(exc: BaseException) -> list[BaseException]:
    """The errors inside ``exc``: trio wraps what fails in a nursery in groups, nested as deep as
    the nurseries were; what failed is at the bottom."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def _ordinary(exc: BaseException) -> bool:
    for module, name in ORDINARY:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(exc, cls):
            return True
    return False


def describe(exc: BaseException, listening: str | None = None) -> str:
    """One line for an ordinary failure; an address that cannot be bound says which, when the command
    knows (``listening``: the flags that set it)."""
    if isinstance(exc, OSError) and exc.errno in BIND_ERRORS and exc.filename is None and listening:
        return f"cannot listen at {listening}: {BIND_ERRORS[exc.errno]}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__  # one line, though a peer's answer had more


def one_line(exc: BaseException, listening: str | None = None) -> str | None:
    """What to print for ``exc`` when every error in it is ordinary (one line each, repeats once),
    else None: the caller logs the traceback."""
    found = leaves(exc)
    if not all(_ordinary(leaf) for leaf in found):
        return None
    return "; ".join(dict.fromkeys(describe(leaf, listening) for leaf in found))
