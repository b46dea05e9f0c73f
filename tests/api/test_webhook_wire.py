"""hub/webhooks/wire.py against small real servers on 127.0.0.1: a connection kept alive between
deliveries, a kept connection the receiver dropped while idle, an answer longer than the excerpt, a
receiver that never answers, HTTPS with a certificate checked (and one refused)."""

from __future__ import annotations

import ssl

import h11
import trio

from hub.webhooks import sender, wire
from tests.e2e.certs import self_signed


class Server:
    """An HTTP/1.1 server that answers each POST with ``body``; ``close_after`` answers per connection
    (then it closes it, as a receiver dropping idle connections does); ``silent``: never answers."""

    def __init__(self, *, body: bytes = b"ok", close_after: int = 0, silent: bool = False,
                 tls: ssl.SSLContext | None = None) -> None:
        self.body, self.close_after, self.silent, self.tls = body, close_after, silent, tls
        self.connections = 0
        self.requests: list[bytes] = []
        self.port = 0

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        if self.tls is not None:
            listeners = [trio.SSLListener(lst, self.tls, https_compatible=True) for lst in listeners]
            self.port = listeners[0].transport_listener.socket.getsockname()[1]
        else:
            self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self)
        await trio.serve_listeners(self._serve, listeners)

    async def _serve(self, stream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        answered = 0
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    self.requests.append(event.target)
                elif isinstance(event, h11.EndOfMessage):
                    if self.silent:
                        await trio.sleep_forever()
                    await stream.send_all(conn.send(h11.Response(status_code=200, headers=[
                        ("Content-Length", str(len(self.body)))])) + conn.send(h11.Data(data=self.body))
                        + conn.send(h11.EndOfMessage()))
                    answered += 1
                    if self.close_after and answered >= self.close_after:
                        return
                    conn.start_next_cycle()
        except (trio.BrokenResourceError, h11.RemoteProtocolError):
            return
        finally:
            await trio.aclose_forcefully(stream)

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/hook?x=1"


async def test_deliveries_share_a_kept_connection_and_a_dropped_one_is_made_again(nursery):
    with trio.fail_after(20):
        kept = await nursery.start(Server().run)
        pool = sender.client(allow_private=True)
        for _ in range(3):
            outcome = await sender.post(kept.url(), b"{}", {"webhook-id": "m1"}, allow_private=True, using=pool)
            assert outcome.ok and outcome.excerpt == "ok"
        assert kept.connections == 1 and kept.requests == [b"/hook?x=1"] * 3

        dropping = await nursery.start(Server(close_after=1).run)
        for _ in range(2):
            outcome = await sender.post(dropping.url(), b"{}", {}, allow_private=True, using=pool)
            await trio.sleep(0.05)  # the receiver closes the connection after its answer
            assert outcome.ok, outcome.error
        assert dropping.connections == 2 and len(dropping.requests) == 2  # each request sent once
        await pool.aclose()


async def test_a_long_answer_keeps_its_excerpt_and_the_connection_closes(nursery):
    with trio.fail_after(20):
        long = await nursery.start(Server(body=b"x" * (wire.EXCERPT_BYTES + wire.MAX_DRAIN + 10_000)).run)
        pool = sender.client(allow_private=True)
        for _ in range(2):
            outcome = await sender.post(long.url(), b"{}", {}, allow_private=True, using=pool)
            assert outcome.ok and outcome.excerpt == "x" * wire.EXCERPT_BYTES
        assert long.connections == 2  # the unread rest of the first answer was not left on a kept connection
        await pool.aclose()


async def test_a_receiver_that_never_answers_costs_the_timeout(nursery):
    with trio.fail_after(20):
        silent = await nursery.start(Server(silent=True).run)
        started = trio.current_time()
        outcome = await sender.post(silent.url(), b"{}", {}, allow_private=True, timeout=0.5)
        assert outcome.status is None and outcome.error == "no answer within 0.5s"
        assert trio.current_time() - started < 5


async def test_https_checks_the_receivers_certificate(nursery, tmp_path):
    with trio.fail_after(20):
        certfile, keyfile = self_signed(tmp_path)
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(certfile, keyfile)
        secure = await nursery.start(Server(tls=server_tls).run)
        trusting = ssl.create_default_context(cafile=str(certfile))
        pool = wire.Pool(allow_private=True, tls=trusting)
        outcome = await sender.post(secure.url("https"), b"{}", {}, allow_private=True, using=pool)
        assert outcome.ok and outcome.excerpt == "ok", outcome.error
        await pool.aclose()
        # the system's trust store does not know this certificate: refused, nothing delivered
        before = len(secure.requests)
        outcome = await sender.post(secure.url("https"), b"{}", {}, allow_private=True)
        assert outcome.status is None and outcome.error.startswith("the request failed")
        assert len(secure.requests) == before
