"""The hub's errors: one tree, each carrying the HTTP status it maps to.

    FleethubError                  status 500, code "internal"
    ├── ClientError                the caller's fault (4xx)
    │   ├── BadRequest             400 invalid_request / malformed_json / unknown_field / bad_uuid ...
    │   ├── Unauthenticated        401 unauthenticated
    │   ├── Forbidden              403 forbidden
    │   ├── NotFound               404 not_found
    │   ├── Conflict               409 conflict
    │   ├── Gone                   410 cursor_expired: an event cursor older than the log's retention
    │   ├── PayloadTooLarge        413 payload_too_large
    │   └── RateLimited            429 rate_limited (retry_after seconds)
    └── ServerError                ours or a peer's fault (5xx)
        ├── StorageError           500 storage_error: failed to load or persist
        ├── DeviceError            502 device_error: the device answered with an error
        ├── DeviceOffline          503 device_offline: no link to the device
        ├── Unavailable            503 unavailable: feature not available on this deployment
        └── DeviceTimeout          504 device_timeout: the device did not answer in time

Actors raise their own tree (actors/errors.py), which knows nothing of HTTP; ``from_actor`` gives
each of those errors its status here (``ACTOR_STATUS``), keeping the actor's code, message and details.
The arrow points one way (the hub imports actors, never the reverse): ``DeviceError`` and
``DeviceOffline`` are also the actors' ``DeviceRefused`` and ``DeviceOffline``, because the device link
(hub/api/link.py) answers the actors' bus requests with them.

Error bodies (DESIGN.md section 7) are built here and nowhere else: ``general_body`` for most
endpoints ``{"error", "message", "details"?}``; memory-test and tunnel endpoints get their own shapes
from their blueprints through ``memtest_body`` and ``tunnel_body``. Messages never carry secrets.
"""

from __future__ import annotations

from typing import Any

from actors import errors as actor_errors


class FleethubError(Exception):
    status = 500
    code = "internal"

    def __init__(self, message: str = "", *, code: str | None = None, details: Any = None,
                 status: int | None = None) -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)
        self.message = message or (self.__class__.__doc__ or self.code).strip()
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.details = details
        self.headers: dict[str, str] = {}


class ClientError(FleethubError):
    status = 400
    code = "invalid_request"


class BadRequest(ClientError):
    """The request is invalid."""
    status = 400
    code = "invalid_request"


class Unauthenticated(ClientError):
    """Authentication required."""
    status = 401
    code = "unauthenticated"


class Forbidden(ClientError):
    """Access denied."""
    status = 403
    code = "forbidden"


class NotFound(ClientError):
    """Not found."""
    status = 404
    code = "not_found"


class Conflict(ClientError):
    """The request conflicts with the current state."""
    status = 409
    code = "conflict"


class Gone(ClientError):
    """The events after this cursor are no longer held (retention): resume from ``details.oldestCursor``."""
    status = 410
    code = "cursor_expired"


class PayloadTooLarge(ClientError):
    """The request body is too large."""
    status = 413
    code = "payload_too_large"


class RateLimited(ClientError):
    """Rate limit exceeded."""
    status = 429
    code = "rate_limited"

    def __init__(self, message: str = "", *, retry_after: float = 1.0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.headers["Retry-After"] = str(max(1, int(retry_after + 0.999)))


class ServerError(FleethubError):
    status = 500
    code = "internal"


class StorageError(ServerError):
    """Failed to load or persist."""
    status = 500
    code = "storage_error"


class DeviceError(ServerError, actor_errors.DeviceRefused):
    """The device failed to handle the request."""
    status = 502
    code = "device_error"


class DeviceOffline(ServerError, actor_errors.DeviceOffline):
    """The device is not connected."""
    status = 503
    code = "device_offline"


class Unavailable(ServerError):
    """Not available on this deployment."""
    status = 503
    code = "unavailable"


def database_unavailable() -> Unavailable:
    """What a caller hears when PostgreSQL cannot be asked (storage's DatabaseUnavailable): REST calls
    (hub/app.py) and the device link's handshake (hub/asgi_websocket.py) say the same."""
    return Unavailable("the database is not reachable; try again shortly", code="database_unavailable")


class DeviceTimeout(ServerError):
    """The device did not answer in time."""
    status = 504
    code = "device_timeout"


# The status of each actor error (the nearest class in its MRO decides); codes stay the actor's.
ACTOR_STATUS: dict[type[actor_errors.AskError], int] = {
    actor_errors.AskError: 500,
    actor_errors.Refused: 400,
    actor_errors.Invalid: 400,
    actor_errors.NotFound: 404,
    actor_errors.Conflict: 409,
    actor_errors.Unsupported: 422,
    actor_errors.TooSoon: 429,
    actor_errors.DeviceFailure: 502,
    actor_errors.DeviceRefused: 502,
    actor_errors.DeviceOffline: 503,
    actor_errors.DeviceTimeout: 504,
    actor_errors.DeviceUnreachable: 504,
    actor_errors.BusUnavailable: 503,
    actor_errors.ActorError: 500,
    actor_errors.MailboxFull: 503,
    actor_errors.AskTimeout: 504,
    actor_errors.ActorStopped: 500,
    actor_errors.ActorCrashed: 500,
}


def from_actor(exc: actor_errors.AskError) -> FleethubError:
    """An actor's error as the hub answers it: the status from ``ACTOR_STATUS``, the actor's code,
    message and details; a ``TooSoon`` carries Retry-After."""
    if isinstance(exc, FleethubError):
        return exc  # already the hub's: the link's DeviceError and DeviceOffline are both
    status = next(ACTOR_STATUS[cls] for cls in type(exc).__mro__ if cls in ACTOR_STATUS)
    if isinstance(exc, actor_errors.TooSoon):
        return RateLimited(exc.message, code=exc.code, details=exc.details, retry_after=exc.retry_after)
    return FleethubError(exc.message, code=exc.code, details=exc.details, status=status)


def general_body(exc: FleethubError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": exc.code, "message": exc.message}
    if exc.details is not None:
        body["details"] = exc.details
    return body


def memtest_body(exc: FleethubError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": exc.code, "message": exc.message}
    if exc.details is not None:
        body["status"] = exc.details
    return body


def tunnel_body(exc: FleethubError) -> dict[str, Any]:
    body: dict[str, Any] = {"error_code": exc.code, "message": exc.message}
    if isinstance(exc.details, dict):
        body.update(exc.details)
    return body
