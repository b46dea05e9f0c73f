"""The tunnel CLI's requests to the hub (webrtc/hubcalls.py): http.client in a thread, on asyncio.

It replaced httpx in ``fleethub tunnel`` (a start cut for every ssh): these check that what httpx gave
the CLI still holds against real local servers: one kept connection for the requests of a start, a
kept connection the hub closed meanwhile, https trust from certifi or SSL_CERT_FILE, proxies from the
environment (a plain one and a CONNECT tunnel), no redirect followed, a timeout and a cancelled caller.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.e2e.certs import self_signed
from webrtc import hubcalls
from webrtc.hubcalls import HubHTTP, HubUnreachable


@pytest.fixture(autouse=True)
def no_proxy_or_trust_env(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                 "no_proxy", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)


class Hub:
    """A threaded HTTP/1.1 server that answers JSON, counts connections and keeps what it was asked."""

    def __init__(self, tls: ssl.SSLContext | None = None, answer: Callable | None = None) -> None:
        self.connections = 0
        self.requests: list[tuple[str, str, dict, bytes]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                hub.connections += 1
                super().setup()

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                hub.requests.append((self.command, self.path, dict(self.headers), body))
                status, headers, payload = (answer or _json_ok)(self.command, self.path, body)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _json_ok(method: str, path: str, body: bytes) -> tuple[int, dict, bytes]:
    return 200, {"content-type": "application/json"}, json.dumps({"data": {"method": method, "path": path}}).encode()


@contextmanager
def hub(**kw) -> Iterator[Hub]:
    h = Hub(**kw)
    try:
        yield h
    finally:
        h.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_the_requests_of_a_start_share_one_kept_connection():
    with hub() as h:
        async def start() -> list:
            http = HubHTTP(f"http://127.0.0.1:{h.port}/prefix", timeout=10)
            got = [await http.request("GET", "/v1/devices", headers={"X-API-Token-ID": "p"}, params={"name": "a b"}),
                   await http.request("POST", "/v1/cli/tunnel/token"),
                   await http.request("POST", "/v1/cli/tunnel/session", json_body={"device_id": "d"})]
            http.close()
            return got

        got = run(start())
    assert [(r.status, r.json()["data"]["path"]) for r in got] == [
        (200, "/prefix/v1/devices?name=a+b"), (200, "/prefix/v1/cli/tunnel/token"),
        (200, "/prefix/v1/cli/tunnel/session")]
    assert got[0].path == "/v1/devices" and got[2].method == "POST"
    assert h.connections == 1  # over a remote https hub: one TCP and TLS handshake, not three
    method, _, headers, body = h.requests[2]
    assert json.loads(body) == {"device_id": "d"} and headers["Content-Type"] == "application/json"
    assert h.requests[0][2]["X-API-Token-ID"] == "p"


def test_a_kept_connection_the_hub_closed_is_replaced_and_the_request_sent_once():
    closes: list[int] = []

    def answer(method, path, body):
        return 200, {"content-type": "application/json"}, b'{"ok": true}'

    with hub(answer=answer) as h:
        async def two() -> list:
            http = HubHTTP(f"http://127.0.0.1:{h.port}", timeout=10)
            first = await http.request("GET", "/a")
            # the hub's keep-alive timeout, as the client sees it: the kept socket closed under it
            http._conn.sock.shutdown(socket.SHUT_RDWR)
            closes.append(1)
            second = await http.request("POST", "/b")
            return [first, second]

        got = run(two())
    assert [r.status for r in got] == [200, 200]
    assert [(m, p) for m, p, _, _ in h.requests] == [("GET", "/a"), ("POST", "/b")]  # /b once
    assert h.connections == 2


def test_a_connection_idle_past_keep_idle_is_not_reused(monkeypatch):
    monkeypatch.setattr(hubcalls, "KEEP_IDLE", 0.05)
    with hub() as h:
        async def two() -> None:
            http = HubHTTP(f"http://127.0.0.1:{h.port}", timeout=10)
            await http.request("GET", "/a")
            await asyncio.sleep(0.2)
            await http.request("GET", "/b")

        run(two())
    assert h.connections == 2


def test_https_trusts_certifi_or_ssl_cert_file_as_httpx_did(tmp_path, monkeypatch):
    certfile, keyfile = self_signed(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(certfile, keyfile)
    with hub(tls=tls) as h:
        url = f"https://127.0.0.1:{h.port}"
        with pytest.raises(HubUnreachable) as refused:
            run(HubHTTP(url, timeout=10).request("GET", "/x"))
        assert "not trusted" in str(refused.value) and not refused.value.timed_out
        monkeypatch.setenv("SSL_CERT_FILE", str(certfile))
        made: list[ssl.SSLContext] = []
        real = hubcalls.tls_context
        monkeypatch.setattr(hubcalls, "tls_context", lambda: made.append(real()) or made[-1])
        monkeypatch.setattr(hubcalls, "KEEP_IDLE", 0.0)  # every request on a new connection, as a renewal is

        async def two() -> list:
            http = HubHTTP(url, timeout=10)
            return [await http.request("GET", "/x"), await http.request("GET", "/y")]

        got = run(two())
    assert [(r.status, r.json()["data"]["path"]) for r in got] == [(200, "/x"), (200, "/y")]
    assert h.connections == 2 and len(made) == 1  # the CA bundle loaded once per hub, not per connection


def test_an_http_hub_never_loads_a_ca_bundle(monkeypatch):
    loads: list[str] = []
    monkeypatch.setattr(hubcalls, "tls_context", lambda: loads.append("tls") or ssl.create_default_context())
    with hub() as h:
        run(HubHTTP(f"http://127.0.0.1:{h.port}", timeout=10).request("GET", "/x"))
    assert loads == []


def test_a_redirect_is_an_answer_not_followed():
    def answer(method, path, body):
        return 302, {"location": "https://elsewhere.invalid/"}, b""

    with hub(answer=answer) as h:
        got = run(HubHTTP(f"http://127.0.0.1:{h.port}", timeout=10).request("POST", "/v1/cli/tunnel/token"))
    assert got.status == 302 and len(h.requests) == 1


def test_error_statuses_come_back_with_their_body():
    def answer(method, path, body):
        return 429, {"content-type": "application/json"}, b'{"error_code": "device_busy"}'

    with hub(answer=answer) as h:
        got = run(HubHTTP(f"http://127.0.0.1:{h.port}", timeout=10).request("POST", "/s", json_body={}))
    assert (got.status, got.json()) == (429, {"error_code": "device_busy"})


class Proxy:
    """An HTTP proxy: absolute-URL requests forwarded, CONNECT tunnelled; records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.auth: list[str | None] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(65536)
            if not data:
                return conn.close()
            head += data
        line, _, rest = head.partition(b"\r\n")
        method, target, _ = line.decode().split(" ")
        self.asked.append(f"{method} {target}")
        auth = [h for h in rest.decode().split("\r\n") if h.lower().startswith("proxy-authorization:")]
        self.auth.append(auth[0].split(":", 1)[1].strip() if auth else None)
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)))
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            hostport = target.split("/")[2]
            upstream = socket.create_connection((hostport.split(":")[0], int(hostport.split(":")[1])))
            upstream.sendall(head.replace(target.encode(), b"/" + target.split("/", 3)[3].encode(), 1))
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def test_proxies_from_the_environment_as_httpx_had_them(tmp_path, monkeypatch):
    proxy = Proxy()
    try:
        with hub() as h:
            monkeypatch.setenv("http_proxy", f"http://user:p%40ss@127.0.0.1:{proxy.port}")
            got = run(HubHTTP(f"http://127.0.0.1:{h.port}", timeout=10).request("GET", "/v1/x"))
            assert got.status == 200 and got.json()["data"]["path"] == "/v1/x"
            assert proxy.asked == [f"GET http://127.0.0.1:{h.port}/v1/x"]
            assert proxy.auth == ["Basic dXNlcjpwQHNz"]  # user:p@ss
            monkeypatch.setenv("no_proxy", "127.0.0.1")
            run(HubHTTP(f"http://127.0.0.1:{h.port}", timeout=10).request("GET", "/v1/y"))
            assert len(proxy.asked) == 1  # no_proxy: straight to the hub

        certfile, keyfile = self_signed(tmp_path)
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(certfile, keyfile)
        monkeypatch.delenv("no_proxy")
        monkeypatch.delenv("http_proxy")
        monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("SSL_CERT_FILE", str(certfile))
        with hub(tls=tls) as h:
            got = run(HubHTTP(f"https://127.0.0.1:{h.port}", timeout=10).request("GET", "/v1/z"))
        assert got.status == 200 and got.json()["data"]["path"] == "/v1/z"
        assert proxy.asked[1:] == [f"CONNECT 127.0.0.1:{h.port}"]  # the hub's TLS end to end
    finally:
        proxy.close()


@contextmanager
def silent_server() -> Iterator[int]:
    """Accepts and never answers."""
    sock = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(sock.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()
        for c in held:
            c.close()


def test_no_answer_in_time_is_a_timeout_and_a_refusal_is_unreachable():
    with silent_server() as port:
        with pytest.raises(HubUnreachable) as waited:
            run(HubHTTP(f"http://127.0.0.1:{port}", timeout=0.3).request("GET", "/x"))
    assert waited.value.timed_out
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(HubUnreachable) as refused:
        run(HubHTTP(f"http://127.0.0.1:{port}", timeout=5).request("GET", "/x"))
    assert not refused.value.timed_out and "refused" in str(refused.value).lower()


def test_a_cancelled_caller_does_not_wait_for_its_request():
    with silent_server() as port:
        async def cancelled() -> float:
            task = asyncio.ensure_future(HubHTTP(f"http://127.0.0.1:{port}", timeout=60).request("GET", "/x"))
            await asyncio.sleep(0.1)
            began = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return time.monotonic() - began

        assert run(cancelled()) < 1.0  # the request's thread is a daemon, left to its 60 s timeout
