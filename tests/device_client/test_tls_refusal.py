"""A hub whose TLS certificate the device does not trust: the agent and ``fleethub agent --check`` say
so, instead of the ``ConnectionTimeout`` trio-websocket turns a failed TLS handshake into."""

from __future__ import annotations

import functools
import ssl

import pytest
import trio

from device_client import check
from device_client.shared.clock import Clock
from device_client.tlsprobe import tls_refusal
from tests.e2e.certs import self_signed
from tests.hubtools import ca_loads_on_main_thread, start_agent
from tests.ports import free_port


@pytest.fixture
def certificate(tmp_path):
    return self_signed(tmp_path)


async def tls_server(nursery: trio.Nursery, certfile, keyfile) -> int:
    """A TLS listener on 127.0.0.1 that completes handshakes and says nothing after them."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(certfile), str(keyfile))

    async def handler(stream: trio.SSLStream) -> None:
        try:
            await stream.do_handshake()
            await stream.receive_some()
        except trio.BrokenResourceError:
            pass

    port = free_port()
    await nursery.start(functools.partial(trio.serve_ssl_over_tcp, handler, port, context, host="127.0.0.1"))
    return port


async def test_the_agent_says_the_hubs_certificate_is_not_trusted(certificate, tmp_path):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            port = await tls_server(nursery, *certificate)
            running = await start_agent(nursery, f"https://127.0.0.1:{port}", "a-token", tmp_path / "agent",
                                        wait=False, connect_timeout=1.0)
            while running.agent.statistics().last_error is None:
                await trio.sleep(0.05)
            error = running.agent.statistics().last_error
            assert "certificate is not trusted" in error and "SSL_CERT_FILE" in error, error
            await running.kill()
            nursery.cancel_scope.cancel()


async def test_an_agent_retrying_a_wss_link_makes_no_tls_context_on_its_loop(certificate, tmp_path, monkeypatch):
    """trio-websocket made ``ssl.create_default_context()`` (the system's CA store loaded: about 60 ms
    of CPU on a slow host) on the agent's loop at every connect; a simulator's devices reconnecting
    after a hub restart each paid it. Made once per process in a worker thread now
    (device_client/shared/outbound_tls.py), for the link and for the probe that explains a refusal."""
    loaded = ca_loads_on_main_thread(monkeypatch)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            port = await tls_server(nursery, *certificate)
            running = await start_agent(nursery, f"https://127.0.0.1:{port}", "a-token", tmp_path / "agent",
                                        wait=False, connect_timeout=1.0)
            while running.agent.statistics().link_failures < 3:
                await trio.sleep(0.05)
            assert "certificate is not trusted" in running.agent.statistics().last_error
            await running.kill()
            nursery.cancel_scope.cancel()
    assert loaded == [], loaded


async def test_agent_check_says_the_hubs_certificate_is_not_trusted(certificate):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            port = await tls_server(nursery, *certificate)
            answer = await check.ask_hub(f"https://127.0.0.1:{port}", "a-token", clock=Clock(), timeout=1.0)
            assert answer.status is None and "certificate is not trusted" in answer.error, answer
            outcome = check.judge_hub(answer, token_checked=True)
            assert not outcome.ok and "self-signed certificate" in outcome.detail, outcome
            nursery.cancel_scope.cancel()


async def test_a_trusted_certificate_is_not_the_reason(certificate):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            port = await tls_server(nursery, *certificate)
            trusted = ssl.create_default_context(cafile=str(certificate[0]))
            assert await tls_refusal(f"wss://127.0.0.1:{port}/v1/device/link", trusted, 5.0) is None
            assert await tls_refusal(f"wss://127.0.0.1:{port}/v1/device/link", None, 5.0) is not None
            assert await tls_refusal(f"ws://127.0.0.1:{port}/v1/device/link", None, 5.0) is None  # not TLS
            nursery.cancel_scope.cancel()
