"""The CLI's side of a tunnel: ask the hub for a session, connect the peer, forward, renew, close.

    GET /v1/devices?name=NAME          (PAT or bearer; org)  → the device, when --device is a name
    POST /v1/cli/tunnel/token          (PAT or bearer; org)  → a tunnel token (15 minutes)
    POST /v1/cli/tunnel/session        {device_id, target, offer: {sdp, type}}
                                       → {grant, answer, signalling_token, ice_servers, expires_at, session_id}
    POST /v1/cli/tunnel/session/{sid}/renew  {grant}  → the renewed grant (and its expires_at)
    DELETE /v1/cli/tunnel/session/{sid}

The renewed grant goes to the device on the ``control`` channel; the device closes a session whose
grant runs out. The offer is made before the hub is asked (the grant binds its DTLS fingerprint),
so its candidates are host candidates; the relay, when allowed, comes in through the device's
candidates, which are gathered with the ICE servers the hub gave it.

All of it runs on one asyncio loop, the one aiortc runs on (connection.py), with no trio and no httpx
in the process (hubcalls.py says why): ``fleethub tunnel`` runs it on its main thread
(cli_tunnel.py); a trio program runs it on loop.py's asyncio thread (trio_client.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import socket
from dataclasses import dataclass
from typing import Any, Callable

from device_client.names import NameLookupError, resolve
from device_client.shared.timestamps import parse_rfc3339, utc_now

from .connection import PeerConnection
from .hubcalls import HubHTTP, HubUnreachable, Response, quoted
from .marks import Marks

log = logging.getLogger("fleethub.tunnel")

TOKEN_REFRESH = 600.0  # seconds after which a tunnel token (15-minute life) is replaced before use
CONNECT_TIMEOUT = 30.0  # seconds for the control channel to open after the answer
RENEW_MIN_MARGIN = 5.0  # renew at least this many seconds before the grant expires
HTTP_TIMEOUT = 60.0  # the hub waits on the device while opening (504 device_unreachable after that)


class TunnelError(Exception):
    """The hub refused (``code`` is its error_code, ``status`` the HTTP status) or the tunnel failed."""

    def __init__(self, message: str, *, code: str = "tunnel_failed", status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass(frozen=True)
class Credentials:
    org_id: str | None = None
    pat_id: str | None = None
    pat_secret: str | None = None
    bearer: str | None = None  # an OAuth access token instead of a PAT

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.pat_id and self.pat_secret:
            headers.update({"X-API-Token-ID": self.pat_id, "X-API-Secret-Key": self.pat_secret})
        elif self.bearer:
            headers["Authorization"] = f"Bearer {self.bearer}"
        else:
            raise TunnelError("no credentials: give a PAT (id and secret) or a bearer token", code="no_credentials")
        if self.org_id:
            headers["X-Organization-ID"] = self.org_id
        return headers


def _data(response: Response) -> dict[str, Any]:
    if response.status >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        code = body.get("error_code") or body.get("error") or f"http_{response.status}"
        raise TunnelError(f"{response.method} {response.path}: {response.status} "
                          f"{code}: {body.get('message', '')}".rstrip(": "), code=str(code),
                          status=response.status)
    try:
        body = response.json()
    except ValueError:
        raise TunnelError(f"the hub answered {response.path} with something not JSON") from None
    if isinstance(body, dict) and isinstance(body.get("data"), dict):
        return body["data"]
    if not isinstance(body, dict):
        raise TunnelError(f"the hub answered {response.path} with a non-object")
    return body


class HubTunnels:
    """The hub's tunnel endpoints, with the tunnel token fetched and refreshed as needed."""

    def __init__(self, client: HubHTTP, credentials: Credentials) -> None:
        self.client = client
        self.credentials = credentials
        self._token: str | None = None
        self._token_at = 0.0

    async def _call(self, method: str, path: str, **kw: Any) -> Response:
        """One request; a transport failure becomes TunnelError hub_unreachable (never a traceback)."""
        try:
            return await self.client.request(method, path, **kw)
        except HubUnreachable as exc:
            if exc.timed_out:
                raise TunnelError(f"the hub at {self.client.base_url} did not answer {method} {path} within "
                                  f"{HTTP_TIMEOUT:.0f}s", code="hub_unreachable") from None
            raise TunnelError(f"cannot reach the hub at {self.client.base_url} ({exc})",
                              code="hub_unreachable") from None

    async def token(self) -> None:
        """Fetch the tunnel token now unless a fresh one is held (the session calls use it)."""
        await self._auth()

    async def _auth(self) -> dict[str, str]:
        now = asyncio.get_running_loop().time()
        if self._token is None or now - self._token_at > TOKEN_REFRESH:
            body = _data(await self._call("POST", "/v1/cli/tunnel/token", headers=self.credentials.headers()))
            token = body.get("token") or body.get("access_token") or body.get("tunnel_token")
            if not isinstance(token, str):
                raise TunnelError("the hub's tunnel token answer has no token")
            self._token, self._token_at = token, now
        headers = {"Authorization": f"Bearer {self._token}"}
        if self.credentials.org_id:
            headers["X-Organization-ID"] = self.credentials.org_id
        return headers

    async def device_id(self, device: str) -> str:
        """``device`` as the operator typed it (an id or a name) as the device's id. The lookup uses the
        credentials themselves: a tunnel token is good for the tunnel endpoints only."""
        async def fetch(path: str, params: dict[str, str]) -> Any:
            return _data(await self._call("GET", path, headers=self.credentials.headers(), params=params))

        try:
            return await resolve("device", device, fetch)
        except NameLookupError as exc:
            raise TunnelError(str(exc), code=exc.code) from None

    async def open(self, device_id: str, target: str, offer: dict[str, str]) -> dict[str, Any]:
        return _data(await self._call("POST", "/v1/cli/tunnel/session", headers=await self._auth(),
                                      json_body={"device_id": device_id, "target": target, "offer": offer}))

    async def renew(self, sid: str, grant: str) -> dict[str, Any]:
        return _data(await self._call("POST", f"/v1/cli/tunnel/session/{quoted(sid)}/renew",
                                      headers=await self._auth(), json_body={"grant": grant}))

    async def delete(self, sid: str) -> None:
        response = await self._call("DELETE", f"/v1/cli/tunnel/session/{quoted(sid)}", headers=await self._auth())
        if response.status != 404:  # already gone is what we wanted
            _data(response)


def grant_expiry(session: dict[str, Any]) -> dt.datetime:
    """When the session's grant runs out: the hub's expires_at, else the grant's own expiresAt."""
    if isinstance(session.get("expires_at"), str):
        try:
            return parse_rfc3339(session["expires_at"])
        except ValueError:
            raise TunnelError("the hub's expires_at is not an RFC 3339 time") from None
    # grant.py loads pyjwt and cryptography's keys: only for a hub that gives no expires_at (ours
    # does), as this runs while ssh's handshake goes through the new tunnel
    from .grant import GrantError, parse_time, read_unverified

    try:
        return parse_time(read_unverified(session.get("grant"))["expiresAt"], "expiresAt")
    except (KeyError, GrantError):
        raise TunnelError("the hub's session answer has no expiry") from None


@dataclass
class Ready:
    host: str  # where the CLI listens ("" with stdio)
    port: int
    session_id: str
    seconds_to_connect: float  # from the session request to the open control channel


@dataclass
class Summary:
    """A session's totals as the CLI saw them, for the line it prints on close."""

    session_id: str | None
    sent: int  # bytes from the local side onto the tunnel (towards the device)
    received: int  # bytes from the device
    seconds: float  # from the open control channel to the close (0 when it never opened)
    path: str  # "direct", "relayed" or "not connected"
    candidates: tuple[str, str] | None  # the selected ICE pair's (local, remote) candidate types

    def line(self) -> str:
        pair = f" ({self.candidates[0]}/{self.candidates[1]} candidates)" if self.candidates else ""
        return (f"{self.sent} bytes sent ({_size(self.sent)}), {self.received} bytes received "
                f"({_size(self.received)}) in {self.seconds:.1f}s, {self.path}{pair}")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _path(pair: tuple[str, str] | None) -> str:
    if pair is None:
        return "not connected"
    return "relayed" if "relay" in pair else "direct"


async def run_tunnel(hub_url: str, credentials: Credentials, device: str, target: str, *,
                     listen: tuple[str, int] = ("127.0.0.1", 0), listener: socket.socket | None = None,
                     stdio: tuple[int, int] | None = None, now: Callable[[], dt.datetime] = utc_now,
                     on_ready: Callable[[Ready], None] | None = None,
                     on_summary: Callable[[Summary], None] | None = None, marks: Marks | None = None) -> str:
    """Forward ``listen`` (or connections accepted on ``listener``, a socket the caller bound, or the
    ``stdio`` pair of fds: one connection) to ``target`` on ``device`` (its id or its name: a name is
    looked up first, and one that no device or several have is a TunnelError) until cancelled (Ctrl-C), the
    device closes the session or, with stdio, that one connection ends ("done"); returns why it ended.
    The session is deleted on the hub either way; ``on_summary`` gets its totals. ``marks`` gets
    each step's time (marks.py); ``now`` is the wall clock the grant's expiry is compared with.
    Runs on asyncio (the loop aiortc runs on); ``on_ready`` is called once the tunnel is usable."""
    loop = asyncio.get_running_loop()
    marks = marks or Marks()
    ended: list[str] = []
    renewed: list[dict[str, Any]] = []
    stop = asyncio.Event()
    control_open = asyncio.Event()
    connected_at: list[float] = []

    def on_control(message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "closing":
            ended.append(f"the device closed the session ({message.get('reason', 'no reason')})")
            stop.set()
        elif kind in ("renewed", "error"):
            renewed.append(message)

    def on_state(state: str) -> None:
        if state in ("failed", "closed"):
            ended.append(f"the peer connection {state}")
            stop.set()

    def stdio_closed() -> None:
        stop.set()  # ssh is done with the connection: so is the session

    http = HubHTTP(hub_url, timeout=HTTP_TIMEOUT)
    hub = HubTunnels(http, credentials)
    # PeerConnection loads aiortc's modules (about 170 ms of imports on the slow bench host). Asking the
    # hub for the device's id and the token in a thread meanwhile was measured: no gain (the import
    # holds the GIL the requests need; docs/tunnel-performance.md), so it is done in order.
    peer = PeerConnection(on_control=on_control, on_state=on_state, on_control_open=control_open.set, marks=marks)
    session: dict[str, Any] | None = None
    renewals: asyncio.Task[None] | None = None
    try:
        device_id = await hub.device_id(device)
        marks.mark("lookup")
        offer = await peer.offer()
        marks.mark("offer")
        await hub.token()
        marks.mark("token")
        asked = loop.time()
        session = await hub.open(device_id, target, offer)
        marks.mark("session")
        sid = str(session["session_id"])
        await peer.set_answer(session["answer"])
        try:
            await asyncio.wait_for(control_open.wait(), CONNECT_TIMEOUT)
        except asyncio.TimeoutError:
            raise TunnelError(f"no connection to device {device_id} within {CONNECT_TIMEOUT:.0f}s "
                              "(no usable ICE candidate pair)", code="not_connected") from None
        connected_at.append(loop.time())
        if stdio is not None:
            await peer.stdio(*stdio, on_closed=stdio_closed)
            host, port = "", 0
        else:
            host, port = await peer.listen(*listen, sock=listener)
        marks.mark("ready")
        if on_ready is not None:
            on_ready(Ready(host, port, sid, loop.time() - asked))
        renewals = asyncio.ensure_future(_renewals(hub, peer, session, now, renewed))
        await stop.wait()
        return ended[0] if ended else ("done" if stdio is not None else "stopped")
    finally:
        async def close() -> None:
            if renewals is not None:
                renewals.cancel()
                await asyncio.gather(renewals, return_exceptions=True)
            pair = peer.candidate_pair() if connected_at else None
            if session is not None and not ended:
                peer.send_control({"type": "closing", "reason": "client_closed"})
            await peer.close()
            if on_summary is not None:
                on_summary(Summary(str(session["session_id"]) if session else None, peer.counters.sent,
                                   peer.counters.received, loop.time() - connected_at[0] if connected_at else 0.0,
                                   _path(pair), pair))
            if session is not None:
                try:
                    await asyncio.wait_for(hub.delete(str(session["session_id"])), 10)
                except (TunnelError, asyncio.TimeoutError) as exc:
                    log.warning("could not delete tunnel session %s on the hub: %s", session.get("session_id"),
                                exc or "no answer within 10s")
            http.close()

        # ssh's SIGHUP often comes while this runs (ssh closed the pipes first, which ended the
        # session): it must not cut the delete short, or the hub counts the session open until its
        # grant runs out (and refuses the device's next one with device_busy). Every wait in it is bounded.
        await _finish(close())


async def _finish(coro: Any) -> None:
    """Run ``coro`` to its end even if the caller is cancelled meanwhile (what trio calls a shielded
    scope); the cancellation is raised once it has finished."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done() and task.cancelled():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    task.result()


async def _renewals(hub: HubTunnels, peer: PeerConnection, session: dict[str, Any],
                    now: Callable[[], dt.datetime], answers: list[dict[str, Any]]) -> None:
    sid, grant, expires = str(session["session_id"]), str(session["grant"]), grant_expiry(session)
    while True:
        lifetime = (expires - now()).total_seconds()
        # renew with a third of the lifetime left, at least RENEW_MIN_MARGIN before the end
        margin = max(RENEW_MIN_MARGIN, min(lifetime / 3, 120.0))
        await asyncio.sleep(max(0.0, (expires - dt.timedelta(seconds=margin) - now()).total_seconds()))
        try:
            body = await hub.renew(sid, grant)
        except TunnelError as exc:
            log.warning("renewing tunnel session %s failed: %s; retrying", sid, exc)
            await asyncio.sleep(min(5.0, max(0.5, margin / 4)))
            if now() >= expires:
                return  # the device closes the session; the caller hears "closing"
            continue
        grant = str(body.get("grant", grant))
        expires = grant_expiry(body if "expires_at" in body else {"grant": grant})
        peer.send_control({"type": "renew", "grant": grant})
        log.info("tunnel session %s renewed until %s", sid, expires.isoformat())
