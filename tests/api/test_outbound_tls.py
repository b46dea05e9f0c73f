"""The TLS context of outbound HTTPS clients (device_client/shared/outbound_tls.py): made once, off the
event loop, trusting what httpx or the system would.

httpx loads certifi's CA bundle into a new SSLContext for every client it makes (about 60 ms of CPU on
the slow bench host, the GIL held): the hub made one on its loop per assistant chat, per upstream
registry fetch and per image digest, the agent one per page-map upload."""

from __future__ import annotations

import ssl
from functools import partial

import httpx
import pytest
import trio

from device_client.shared import outbound_tls
from tests.api.assistant_helpers import sign_in
from tests.api.upstream_fake import FakeModel, start_fake_model, text_chunks
from tests.e2e.certs import self_signed
from tests.hubtools import ca_loads_on_main_thread, start_hub, threads_calling


@pytest.fixture
def fresh(monkeypatch):
    """No context made yet in this process, and no trust variable from the environment."""
    monkeypatch.setattr(outbound_tls, "_made", {})
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)


async def _one_answer(server_tls: ssl.SSLContext, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async def answer(stream: trio.SSLStream) -> None:
        try:
            await stream.receive_some(65536)
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        except trio.BrokenResourceError:
            pass  # a client that refused our certificate
        finally:
            await trio.aclose_forcefully(stream)

    listeners = await trio.open_ssl_over_tcp_listeners(0, server_tls, host="127.0.0.1")
    task_status.started(listeners[0].transport_listener.socket.getsockname()[1])
    await trio.serve_listeners(answer, listeners)


async def test_one_context_per_trust_made_in_a_worker_thread_and_shared(fresh, monkeypatch, nursery, tmp_path):
    built = threads_calling(monkeypatch, outbound_tls, "_build_httpx")
    with trio.fail_after(30):
        got: list[ssl.SSLContext] = []

        async def ask() -> None:
            got.append(await outbound_tls.httpx_default())
        async with trio.open_nursery() as asking:  # concurrent first callers wait for the one build
            for _ in range(4):
                asking.start_soon(ask)
        assert built == [False] and len({id(c) for c in got}) == 1
        assert await outbound_tls.httpx_default() is got[0] and built == [False]
        assert got[0].verify_mode == ssl.CERT_REQUIRED and got[0].check_hostname

        # Trust as httpx gives it: SSL_CERT_FILE names the bundle, read at each call; a server whose
        # certificate only that bundle holds is reached with it and refused without it.
        certfile, keyfile = self_signed(tmp_path)
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(certfile, keyfile)
        port = await nursery.start(partial(_one_answer, server_tls))
        url = f"https://127.0.0.1:{port}/"
        async with httpx.AsyncClient(verify=got[0]) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(url)
        monkeypatch.setenv("SSL_CERT_FILE", str(certfile))
        private = await outbound_tls.httpx_default()
        assert private is not got[0] and built == [False, False]
        async with httpx.AsyncClient(verify=private) as client:
            r = await client.get(url)
        assert (r.status_code, r.text) == (200, "ok")
        system = await outbound_tls.system_default()
        assert system is await outbound_tls.system_default() and system is not private


async def test_an_assistant_chat_loads_no_ca_bundle_on_the_hubs_loop(nursery, db_url, tmp_path, monkeypatch):
    """Each chat made an httpx client, and so a TLS context with certifi's bundle, on the loop."""
    with trio.fail_after(60):
        fake = await start_fake_model(nursery, FakeModel(respond=lambda body: [*text_chunks("fine"), "done"]))
        hub = await start_hub(nursery, db_url, tmp_path, assistant_upstream=fake.base_url, assistant_key="sk-x")
        browser = await sign_in(hub)
        loaded = ca_loads_on_main_thread(monkeypatch)
        for _ in range(2):
            r = await browser.chat(question="how are my devices?")
            assert r.status_code == 200, r.text
        assert len(fake.requests) == 2
    assert loaded == [], loaded
