"""The agent's tunnel verbs against the fake hub, with a real aiortc client peer and a TCP echo target.

Grants are signed here with a local key the fake hub announces in welcome.hubKeys, exactly as the
hub would. Real sockets, real asyncio thread: trio's real clock, short grant lifetimes.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
from functools import partial

import pytest
import trio
from nacl.signing import SigningKey

from device_client.agent import Agent, AgentConfig
from device_client.shared.clock import rfc3339
from device_client.tunnel import TunnelConfig
from webrtc.device_tunnel import attach as tunnel_engine
from webrtc.grant import GRANT_VERSION, sign_grant
from webrtc.loop import restrict_host_addresses
from webrtc.peer import TunnelPeer
from webrtc.sdp import fingerprint

from device_fakehub import FakeHub

HUB_KEY = SigningKey.generate()
KID = "hub-test"


async def echo(stream: trio.SocketStream) -> None:
    async with stream:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
        await stream.send_eof()


async def roundtrip(port: int, payload: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = bytearray()
    async with stream:
        await stream.send_all(payload)
        await stream.send_eof()
        while data := await stream.receive_some(1 << 20):
            received += data
    return bytes(received)


class Rig:
    def __init__(self, nursery, hub: FakeHub, agent: Agent, link, echo_port: int) -> None:
        self.nursery, self.hub, self.agent, self.link, self.echo_port = nursery, hub, agent, link, echo_port
        self.control: list[dict] = []

    def grant(self, offer: dict, *, lifetime: float = 60.0, key: SigningKey = HUB_KEY, **overrides) -> str:
        now = self.agent.clock.now()
        body = {"v": GRANT_VERSION, "kid": KID, "sid": "sess-1", "orgId": "org-1", "deviceId": self.agent.device_id,
                "principal": "user:test", "target": "echo", "notBefore": rfc3339(now),
                "expiresAt": rfc3339(now + dt.timedelta(seconds=lifetime)), "relay": False,
                "bandwidthBps": None, "clientFingerprint": fingerprint(offer["sdp"]),
                "deviceKey": self.agent.public_key_b64}
        body.update(overrides)
        return sign_grant(body, key)

    async def client(self) -> tuple[TunnelPeer, dict]:
        peer = TunnelPeer(on_control=self.control.append)
        return peer, await peer.create_offer()

    async def open(self, **grant_overrides) -> tuple[TunnelPeer, int, str]:
        peer, offer = await self.client()
        grant = self.grant(offer, **grant_overrides)
        reply = await self.link.command("tunnel.open", {"grant": grant, "offer": offer, "iceServers": []})
        assert reply.ok, reply.error
        await peer.set_answer(reply.payload["answer"])
        await peer.wait_control_open()
        _, port = await peer.listen("127.0.0.1", 0)
        return peer, port, grant


@pytest.fixture
async def rig(nursery, tmp_path):
    restrict_host_addresses(["127.0.0.1"])
    listeners = await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
    echo_port = listeners[0].socket.getsockname()[1]
    hub = await nursery.start(FakeHub().serve)
    hub.hub_keys = {KID: base64.b64encode(bytes(HUB_KEY.verify_key)).decode()}
    config = TunnelConfig(targets={"echo": ("127.0.0.1", echo_port), "closed": ("127.0.0.1", 1)},
                          allowed_ports=frozenset({echo_port}), ssh=False)
    agent = Agent(AgentConfig(hub.url, "tok", tmp_path / "dev", backoff_initial=0.01, backoff_max=0.04, tunnel=config,
                              tunnel_engine=tunnel_engine))
    await nursery.start(agent.run)
    link = await hub.next_link()
    return Rig(nursery, hub, agent, link, echo_port)


async def test_hello_announces_tunnels_and_open_forwards_bytes(rig):
    with trio.fail_after(30):
        assert rig.link.hello.capabilities.tunnel is True
        assert rig.link.hello.tunnelPublicKey == rig.agent.public_key_b64
        targets = rig.link.hello.tunnelTargets
        assert (targets.names, targets.ports, targets.ssh) == (["closed", "echo"], [rig.echo_port], False)
        assert rig.agent.hub_keys == rig.hub.hub_keys
        peer, port, _ = await rig.open()
        payload = os.urandom(300_000)
        assert await roundtrip(port, payload) == payload
        reply = await rig.link.command("tunnel.close", {"sessionId": "sess-1", "reason": "test_done"})
        assert reply.ok and reply.payload == {"closed": True}
        usage = (await rig.link.next_event("tunnel.usage")).payload
        assert usage["final"] is True and usage["reason"] == "test_done"
        assert (usage["bytesIn"], usage["bytesOut"], usage["relayedBytes"]) == (300_000, 300_000, 0)
        assert usage["durationSeconds"] > 0
        assert rig.agent.tunnel.sessions == {}
        assert (await rig.link.command("tunnel.close", {"sessionId": "sess-1"})).payload == {"closed": False}
        await peer.close()


async def test_a_port_number_the_device_allows_is_a_target(rig):
    with trio.fail_after(30):
        peer, port, _ = await rig.open(target=str(rig.echo_port))
        assert await roundtrip(port, b"by port") == b"by port"
        await peer.close()


@pytest.mark.parametrize("case, expected", [
    ("forged", "signature does not verify"),
    ("altered", "signature does not verify"),
    ("wrong_device", "another device"),
    ("expired", "expired"),
    ("unknown_kid", "unknown key"),
    ("other_offer", "fingerprint"),
])
async def test_the_device_refuses_a_bad_grant(rig, case, expected):
    with trio.fail_after(30):
        peer, offer = await rig.client()
        if case == "forged":
            grant = rig.grant(offer, key=SigningKey.generate())
        elif case == "altered":
            head, _, sig = rig.grant(offer).split(".")
            other_claims = rig.grant(offer, target=str(rig.echo_port)).split(".")[1]
            grant = f"{head}.{other_claims}.{sig}"
        elif case == "wrong_device":
            grant = rig.grant(offer, deviceId="dev-other")
        elif case == "expired":
            now = rig.agent.clock.now()
            grant = rig.grant(offer, notBefore=rfc3339(now - dt.timedelta(minutes=10)),
                              expiresAt=rfc3339(now - dt.timedelta(seconds=1)))
        elif case == "unknown_kid":
            grant = rig.grant(offer, kid="hub-unknown")
        else:
            other_peer, other_offer = await rig.client()
            grant = rig.grant(other_offer)
            await other_peer.close()
        reply = await rig.link.command("tunnel.open", {"grant": grant, "offer": offer, "iceServers": []})
        assert not reply.ok
        assert reply.error.code == "invalid_grant" and expected in reply.error.message
        assert rig.agent.tunnel.sessions == {}
        await peer.close()


@pytest.mark.parametrize("target, code", [("database", "target_not_configured"), ("ssh", "ssh_disabled"),
                                          ("2", "target_not_configured")])
async def test_targets_the_device_does_not_offer_are_refused(rig, target, code):
    with trio.fail_after(30):
        peer, offer = await rig.client()
        reply = await rig.link.command("tunnel.open", {"grant": rig.grant(offer, target=target), "offer": offer})
        assert not reply.ok and reply.error.code == code
        await peer.close()


async def test_an_unrenewed_session_closes_at_expiry_and_renewal_extends_it(rig):
    with trio.fail_after(40):
        peer, port, grant = await rig.open(lifetime=3.0)
        started = trio.current_time()
        await trio.sleep(1.0)
        renewed = rig.grant({"sdp": "a=fingerprint:" + rig.agent.tunnel.sessions["sess-1"].grant.client_fingerprint},
                            lifetime=5.0)
        peer.send_control({"type": "renew", "grant": renewed})
        while not any(m.get("type") == "renewed" for m in rig.control):
            await trio.sleep(0.05)
        await trio.sleep_until(started + 4.0)  # past the first grant's expiry
        assert await roundtrip(port, b"still open") == b"still open"
        usage = (await rig.link.next_event("tunnel.usage")).payload
        elapsed = trio.current_time() - started
        assert usage["final"] is True and usage["reason"] == "expired"
        assert 5.0 <= elapsed < 8.0, elapsed
        assert {"type": "closing", "reason": "expired"} in rig.control
        await peer.close()


async def test_a_renewal_for_another_session_is_refused(rig):
    with trio.fail_after(30):
        peer, port, grant = await rig.open(lifetime=30.0)
        session = rig.agent.tunnel.sessions["sess-1"]
        other = rig.grant({"sdp": "a=fingerprint:" + session.grant.client_fingerprint}, sid="sess-2", lifetime=60)
        peer.send_control({"type": "renew", "grant": other})
        while not rig.control:
            await trio.sleep(0.05)
        assert rig.control[0]["type"] == "error" and "sid" in rig.control[0]["reason"]
        reply = await rig.link.command("tunnel.ice_restart", {"sessionId": "sess-1", "offer": {}})
        assert not reply.ok and reply.error.code == "device_unsupported"
        await peer.close()


async def test_a_session_nobody_renews_closes_when_its_grant_expires(rig):
    with trio.fail_after(30):
        peer, port, _ = await rig.open(lifetime=2.0)
        started = trio.current_time()
        assert await roundtrip(port, b"before") == b"before"
        usage = (await rig.link.next_event("tunnel.usage")).payload
        assert usage["final"] is True and usage["reason"] == "expired"
        assert 1.0 <= trio.current_time() - started < 3.5
        while {"type": "closing", "reason": "expired"} not in rig.control:
            await trio.sleep(0.05)
        # the peer connection is gone: a new local connection is closed at once instead of hanging
        with trio.fail_after(5):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            try:
                await stream.send_all(b"after")
                assert await stream.receive_some(10) == b""
            except trio.BrokenResourceError:
                pass  # reset rather than closed: refused all the same
            await stream.aclose()
        await peer.close()


async def test_an_agent_without_the_tunnel_engine_has_no_tunnels(nursery, tmp_path):
    # device_client cannot import webrtc: the launcher passes the engine in, and without it the agent
    # advertises nothing it could not serve
    with pytest.raises(ValueError, match="tunnel engine"):
        Agent(AgentConfig("http://127.0.0.1:9", "tok", tmp_path / "x", tunnel=TunnelConfig(ssh=True)))
    with trio.fail_after(30):
        hub = await nursery.start(FakeHub().serve)
        agent = Agent(AgentConfig(hub.url, "tok", tmp_path / "dev", backoff_initial=0.01, backoff_max=0.04))
        await nursery.start(agent.run)
        link = await hub.next_link()
        assert agent.tunnel is None
        assert link.hello.capabilities.tunnel is False and link.hello.tunnelTargets is None
        reply = await link.command("tunnel.open", {"grant": "x", "offer": {"sdp": "", "type": "offer"}})
        assert not reply.ok and reply.error.code == "unknown_command"  # the hub: 409 device_unsupported


async def test_an_offer_with_audio_or_video_is_refused_before_its_grant_is_read(rig):
    """A tunnel carries data channels only: an offer that also asks for media would have the device
    decode what the caller sends (and aiortc runs without PyAV here, webrtc/mediafree.py)."""
    with trio.fail_after(30):
        peer, offer = await rig.client()
        sdp = offer["sdp"] + "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:111 opus/48000/2\r\n"
        reply = await rig.link.command("tunnel.open", {"grant": rig.grant(offer), "offer": {**offer, "sdp": sdp}})
        assert not reply.ok and reply.error.code == "rejected"
        assert "data channels only" in reply.error.message and "'audio'" in reply.error.message
        assert rig.agent.tunnel.sessions == {}
        await peer.close()
