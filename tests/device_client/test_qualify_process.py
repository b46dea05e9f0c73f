"""The kit as a device maker runs it: ``fleethub device-test --listen 127.0.0.1:0`` as a process,
against ``fleethub agent`` as another process (its own reboots re-execute it), and against a broken
client. Exit status and the printed verdicts are what is checked, as a CI job would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import trio

from device_client.qualify.rules import RULES

FLEETHUB = [sys.executable, "-m", "hub.cli"]
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "dev_qualify_process"


async def _start_kit(nursery, *extra: str) -> tuple[trio.Process, int, list[bytes]]:
    """The kit's process and the port it listens on (read from its 'waiting for a device' line)."""
    kit = await trio.lowlevel.open_process([*FLEETHUB, "device-test", "--listen", "127.0.0.1:0", "--token", TOKEN,
                                            *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           cwd=ROOT)
    out: list[bytes] = []

    async def drain_stdout() -> None:
        async for chunk in kit.stdout:
            out.append(chunk)

    nursery.start_soon(drain_stdout)
    seen = b""
    async for chunk in kit.stderr:
        seen += chunk
        found = re.search(rb"ws://127\.0\.0\.1:(\d+)/v1/device/link", seen)
        if found:
            nursery.start_soon(_drain, kit.stderr)
            return kit, int(found.group(1)), out
    raise AssertionError(f"the kit never said where it listens: {seen.decode(errors='replace')}")


async def _drain(stream) -> None:
    async for _ in stream:
        pass


async def test_the_kit_process_qualifies_the_agent_process(nursery, tmp_path):
    with trio.fail_after(300):
        # --superseded-wait is the agent's own 30 s: the agent under test runs with its defaults, so
        # its slowest backoff (30 s) after 4003, the 401 and 4426 takes most of the run.
        kit, port, out = await _start_kit(nursery, "--heartbeat", "0.5", "--reconnect-timeout", "60")
        env = {**os.environ, "FLEETHUB_DEVICE_TOKEN": TOKEN}
        agent = await trio.lowlevel.open_process([*FLEETHUB, "agent", "--hub", f"http://127.0.0.1:{port}",
                                                  "--data-dir", str(tmp_path / "agent")], env=env, cwd=ROOT,
                                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        nursery.start_soon(_drain, agent.stdout)
        nursery.start_soon(_drain, agent.stderr)
        try:
            code = await kit.wait()
        finally:
            agent.kill()
            await agent.wait()
        await trio.sleep(0.1)  # the last of the kit's output
        text = b"".join(out).decode()
        assert code == 0, text
        verdicts = {rule: status for status, rule in re.findall(r"^(PASS|FAIL|NOT RUN)\s+(\w+)", text, re.M)}
        assert verdicts == {r.id: "PASS" for r in RULES}, text


async def test_the_kit_process_fails_a_broken_client(nursery, tmp_path):
    with trio.fail_after(60):
        kit, port, out = await _start_kit(nursery, "--reconnect-timeout", "2")
        # A client that forgets the hello's type: the kit closes it as the hub would (4400) and fails it.
        client = (
            "import json, sys, trio\n"
            "from trio_websocket import open_websocket_url, ConnectionClosed\n"
            "async def main():\n"
            f"    async with open_websocket_url('ws://127.0.0.1:{port}/v1/device/link',\n"
            f"            extra_headers=[(b'authorization', b'Bearer {TOKEN}')]) as ws:\n"
            "        await ws.send_message(json.dumps({'firmware': 'fw-1'}))\n"
            "        try:\n"
            "            while True: await ws.get_message()\n"
            "        except ConnectionClosed as exc:\n"
            "            print(exc.reason.code, exc.reason.reason)\n"
            "trio.run(main)\n")
        result = await trio.run_process([sys.executable, "-c", client], capture_stdout=True, capture_stderr=True,
                                        cwd=ROOT, check=False)
        code = await kit.wait()
        await trio.sleep(0.1)
        text = b"".join(out).decode()
        assert code == 1, text
        assert re.search(r"^FAIL\s+H1 ", text, re.M) and "NOT QUALIFIED" in text, text
        seen = result.stdout.decode()
        assert seen.startswith("4400 malformed hello") and "'type'" in seen, (seen, result.stderr.decode())
