"""A scripted device for the tunnel control-plane tests: a real WebSocket to a real hub, whose tunnel
verbs answer as the test says (accept with a canned SDP answer, refuse with a code, or never answer).

It is not a WebRTC peer: the control plane only carries the offer and the answer, and what the
device does with them is the data plane's (webrtc/, webrtc/device_tunnel.py, tested there).
"""

from __future__ import annotations

import base64
from typing import Any

import trio
from nacl.signing import SigningKey
from trio_websocket import ConnectionClosed, open_websocket_url

from device_client.shared import protocol
from device_client.agent import link_url

FINGERPRINT = "sha-256 " + ":".join(f"{i:02X}" for i in range(32))
OFFER = {"type": "offer",
         "sdp": "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=fingerprint:" + FINGERPRINT + "\r\n"}
ANSWER = {"type": "answer", "sdp": "v=0\r\no=- 2 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"}


class Refuse(Exception):
    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(code)
        self.code, self.message = code, message


class TunnelDevice:
    def __init__(self, hub, token: str, *, names=("ssh", "web"), ports=(8080,), ssh: bool = True,
                 identity: bool = True) -> None:
        self.hub, self.token = hub, token
        self.key = SigningKey.generate()
        self.public_key = base64.b64encode(bytes(self.key.verify_key)).decode()
        self.hello = protocol.Hello(
            firmware="scripted 1.0", architecture="x86_64", capabilities=protocol.Capabilities(tunnel=True),
            tunnelPublicKey=self.public_key if identity else None,
            tunnelTargets=protocol.TunnelTargets(names=list(names), ports=list(ports), ssh=ssh))
        self.commands: list[tuple[str, dict]] = []
        self.refuse: Refuse | None = None  # the next opens are refused with this
        self.silent = False                # the next commands are never answered
        self.hub_keys: dict[str, str] = {}
        self.ws: Any = None
        self.scope = trio.CancelScope()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        headers = [(b"authorization", f"Bearer {self.token}".encode())]
        with self.scope:
            async with open_websocket_url(link_url(self.hub.base_url), extra_headers=headers) as ws:
                self.ws = ws
                await ws.send_message(protocol.encode(self.hello))
                welcome = protocol.decode(await ws.get_message())
                assert isinstance(welcome, protocol.Welcome)
                self.hub_keys = welcome.hubKeys
                task_status.started(self)
                async with trio.open_nursery() as nursery:
                    while True:
                        try:
                            frame = protocol.decode(await ws.get_message())
                        except ConnectionClosed:
                            break
                        if isinstance(frame, protocol.Command):
                            nursery.start_soon(self._answer, frame)
                    nursery.cancel_scope.cancel()

    async def _answer(self, cmd: protocol.Command) -> None:
        verb = protocol.verb_of(cmd.subject)
        self.commands.append((verb, cmd.payload))
        if self.silent:
            await trio.sleep_forever()
        try:
            if verb == "tunnel.open":
                if self.refuse is not None:
                    raise self.refuse
                payload = {"answer": ANSWER}
            elif verb == "tunnel.ice_restart":
                payload = {"answer": {**ANSWER, "sdp": ANSWER["sdp"] + "a=ice-restart\r\n"}}
            elif verb == "tunnel.close":
                payload = {"closed": True}
            else:
                raise Refuse("unknown_command", f"no command {verb!r}")
            reply = protocol.Reply(id=cmd.id, ok=True, payload=payload)
        except Refuse as exc:
            reply = protocol.Reply(id=cmd.id, ok=False, error=protocol.ReplyError(code=exc.code, message=exc.message))
        try:
            await self.ws.send_message(protocol.encode(reply))
        except ConnectionClosed:
            pass

    async def event(self, kind: str, payload: dict) -> None:
        await self.ws.send_message(protocol.encode(protocol.Event(kind=kind, payload=payload)))

    def sent(self, verb: str) -> list[dict]:
        return [p for v, p in self.commands if v == verb]
