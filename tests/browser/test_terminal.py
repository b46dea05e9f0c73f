"""The browser terminal in a real Chromium against a real hub, PostgreSQL and agents: the page's own
RTCPeerConnection to the agent's ``shell`` target (a real PTY), echo, Ctrl-C, resize, closing the tab
ending the session on the hub with its usage recorded, and a device without the switch refused.

Headless Chromium hides its host candidates behind mDNS names, which aiortc cannot resolve, and
gathers none on loopback by default: the browser here is launched with both changed (a real
operator's browser reaches a device through the session's TURN relay instead; docs/console.md).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from device_client.shell import ShellUser
from device_client.tunnel import TunnelConfig
from tests.browser.conftest import (
    CHROMIUM,
    CHROMIUM_ARGS,
    PASSWORD,
    ConsoleHub,
    _why_no_browser,
    sign_in,
)
from tests.hubtools import start_agent, start_hub
from tests.threadhub import add_operator, hub_in_thread
from tests.turntools import running_coturn
from webrtc import pmtu
from webrtc.loop import restrict_host_addresses

BROWSER_ARGS = [*CHROMIUM_ARGS, "--disable-features=WebRtcHideLocalIpsWithMdns",
                "--allow-loopback-in-peer-connection"]


TURN_SECRET = "turn-terminal-" + uuid.uuid4().hex
GRANT_SECONDS = 4  # short grants: the page renews within every test that stays connected a while


@pytest.fixture(scope="module")
def coturn(tmp_path_factory):
    """A real coturn on 127.0.0.1 with the hub's TURN REST secret."""
    with running_coturn(tmp_path_factory.mktemp("coturn"), TURN_SECRET) as (port, _proc, _log):
        yield port


@pytest.fixture(scope="module")
def terminal_hub(pg_server_dsn, pg_template, coturn):
    why = _why_no_browser()
    if why:
        pytest.skip(why)

    async def setup(nursery: trio.Nursery, db_url: str, root: Path) -> dict[str, Any]:
        restrict_host_addresses(["127.0.0.1"])
        hub = await start_hub(nursery, db_url, root / "hub", heartbeat_interval=0.5,
                              tunnel_grant_seconds=GRANT_SECONDS,
                              turn_urls=(f"turn:127.0.0.1:{coturn}?transport=udp",),
                              turn_secret=TURN_SECRET)
        s = hub.services
        await s.tunnels.store.set_entitlement(uuid.UUID(hub.org_id), {"enabled": True, "relay_allowed": True},
                                              s.clock.now())
        email = await add_operator(hub, PASSWORD)
        me = ShellUser.lookup(None)
        # bash (for $RANDOM), whatever the test user's login shell is
        shell = TunnelConfig(shell=ShellUser(me.name, me.uid, me.gid, me.home, "/bin/bash"))
        agents, devices = {}, {}
        for dev_name, config in (("term-on", shell), ("term-off", TunnelConfig())):
            dev_id, token = await hub.provision(dev_name)
            agents[dev_name] = await start_agent(nursery, hub.base_url, token, root / dev_name, tunnel=config)
            devices[dev_name] = dev_id
        return {"hub": hub, "email": email, "agents": agents, "devices": devices}

    with hub_in_thread(pg_server_dsn, pg_template, "terminal", setup) as ready, httpx.Client(timeout=30) as http:
        yield ConsoleHub(ready["hub"], ready["token"], http, ready["devices"]["term-on"], "",
                         {"root": ready["root"]}, email=ready["email"], agents=ready["agents"],
                         devices=ready["devices"])


@pytest.fixture(scope="module")
def terminal_browser(terminal_hub):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS, timeout=30_000)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def tpage(terminal_browser, terminal_hub):
    """A fresh context at 1280 px; script errors and CSP violations on the page fail the test."""
    context = terminal_browser.new_context(base_url=terminal_hub.base_url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("console", lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    try:
        yield pg
    finally:
        context.close()
    assert not errors, f"script errors or CSP violations on the page: {errors}"


SCREEN = """() => {
  const t = document.querySelector('#terminal-screen').fleethubTerminal;
  const b = t.buffer.active, lines = [];
  for (let i = 0; i < b.length; i++) lines.push(b.getLine(i).translateToString(true));
  return lines.join('\\n');
}"""


def screen_text(page) -> str:
    return page.evaluate(SCREEN)


def wait_screen(page, pattern: str, timeout: float = 15_000) -> None:
    page.wait_for_function(f"(re) => new RegExp(re, 'm').test(({SCREEN})())", arg=pattern, timeout=timeout)


def open_terminal(page, hub, device: str) -> None:
    sign_in(page, hub, f"/console/devices/{hub.devices[device]}")
    page.click("#terminal-open")


def sessions(hub, device: str) -> list[dict]:
    async def rows():
        return [dict(r) for r in await hub.hub.services.db.fetch(
            "SELECT * FROM tunnel_sessions WHERE device_id = $1::uuid ORDER BY opened_at", hub.devices[device])]
    return hub.run(rows)


def test_echo_ctrl_c_resize_and_closing_the_tab_ends_the_session(tpage, terminal_hub, screenshots, monkeypatch):
    page, hub = tpage, terminal_hub
    before = len(sessions(hub, "term-on"))
    probed = []  # what the agent's path probe (webrtc/pmtu.py) confirmed with Chromium's SCTP
    probe = pmtu.probe

    async def record(sctp):
        probed.append(await probe(sctp))
        return probed[-1]

    monkeypatch.setattr(pmtu, "probe", record)
    open_terminal(page, hub, "term-on")
    page.wait_for_selector("#terminal-state[data-state=connected]")
    # echo through the PTY: the shell expands $RANDOM, so the output is the device's, not our echo
    page.click("#terminal-screen")
    page.keyboard.type("echo hello-$RANDOM\n")
    wait_screen(page, r"hello-\d+")
    assert re.search(r"^hello-\d+$", screen_text(page), re.MULTILINE)
    # Ctrl-C interrupts the foreground job
    page.keyboard.type("sleep 100; echo not-interrupted\n")
    page.wait_for_timeout(300)
    page.keyboard.press("Control+c")
    page.keyboard.type("echo after-$((40+2))\n")
    wait_screen(page, r"after-42", timeout=5_000)
    assert not re.search(r"^not-interrupted$", screen_text(page), re.MULTILINE)  # only the typed command line
    # resize: a smaller window gives the shell fewer columns (fit addon -> resize message -> TIOCSWINSZ)
    page.keyboard.type("stty size\n")
    wait_screen(page, r"^\d+ \d+$")
    first = re.findall(r"^(\d+) (\d+)$", screen_text(page), re.MULTILINE)[-1]
    page.set_viewport_size({"width": 700, "height": 900})
    page.wait_for_function("() => document.querySelector('#terminal-screen').fleethubTerminal.cols < " + first[1])
    page.keyboard.type("clear; stty size\n")
    page.wait_for_function(f"() => /^\\d+ \\d+$/m.test(({SCREEN})()) && !/^{first[0]} {first[1]}$/m.test(({SCREEN})())")
    cols = page.evaluate("() => document.querySelector('#terminal-screen').fleethubTerminal.cols")
    rows = page.evaluate("() => document.querySelector('#terminal-screen').fleethubTerminal.rows")
    assert re.search(rf"^{rows} {cols}$", screen_text(page), re.MULTILINE), screen_text(page)
    page.keyboard.type("echo hello-$RANDOM; uname -s\n")
    wait_screen(page, r"^Linux$")
    # bulk output: the PTY's reads queue up into 32 KiB messages, cut in the chunks the agent's path
    # probe left it with. Chromium's SCTP takes no packet over its own size (a 1,192-byte probe went
    # unanswered, a 1,100-byte one was echoed, 2026-11-28), so the agent keeps aiortc's 1,160 bytes
    # for a browser; either way the output arrives whole
    page.keyboard.type("clear; seq 1 60000; echo end-$((60000+2))\n")
    wait_screen(page, r"^end-60002$", timeout=30_000)
    assert re.search(r"^59999\n60000\nend-60002$", screen_text(page), re.MULTILINE), screen_text(page)[-300:]
    assert len(probed) == 1 and probed[0] in (None, 1404), probed  # one probe per association
    page.locator("#terminal").screenshot(path=str(screenshots / "console-terminal.png"))

    opened = sessions(hub, "term-on")[before:]
    assert len(opened) == 1 and opened[0]["state"] in ("opening", "open") and opened[0]["target"] == "shell"
    sid = opened[0]["id"]
    page.close(run_before_unload=True)  # pagehide: the DELETE leaves with fetch keepalive

    async def ended():
        with trio.fail_after(20):
            while True:
                row = await hub.hub.services.db.fetchrow("SELECT * FROM tunnel_sessions WHERE id = $1", sid)
                # the page's DELETE reached the hub (sent with fetch keepalive as the page went away)
                deleted = await hub.hub.services.db.fetchval(
                    "SELECT count(*) FROM audit_events WHERE method = 'DELETE' AND path = $1",
                    f"/v1/cli/tunnel/session/{sid}")
                if row["state"] not in ("opening", "open") and row["bytes_in"] and deleted:
                    return dict(row)
                await trio.sleep(0.1)

    row = hub.run(ended)
    assert row["state"] == "closed" and row["bytes_in"] > 0 and row["bytes_out"] > 0, row
    assert row["close_reason"] in ("closed by the client", "client_closed"), row


def test_a_device_without_the_shell_switch_shows_the_refusal(tpage, terminal_hub):
    open_terminal(tpage, terminal_hub, "term-off")
    tpage.wait_for_selector("#terminal-state[data-state=closed]:has-text('disabled')")
    assert "shell target is disabled" in tpage.text_content("#terminal-state")


def test_a_browser_that_hides_its_addresses_connects_through_the_relay(terminal_hub, terminal_browser):
    """Chromium as an operator runs it: host candidates behind mDNS names (aiortc cannot resolve
    them), none on loopback. The page gathers with the hub's TURN server before its offer, so the
    device reaches the browser's relay candidate; the session's usage says the bytes were relayed."""
    hub = terminal_hub
    before = len(sessions(hub, "term-on"))
    # a second Chromium, with the default WebRTC behaviour (the module's has it changed)
    browser = terminal_browser.browser_type.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
    offers: list[str] = []
    # The device offers no host candidate for this session, only its relay: on one machine the
    # browser could otherwise reach the device's 127.0.0.1 directly and no relay would be needed.
    restrict_host_addresses([])
    try:
        try:
            context = browser.new_context(base_url=hub.base_url, viewport={"width": 1280, "height": 900})
            context.set_default_timeout(20_000)
            page = context.new_page()
            page.on("request", lambda r: offers.append(r.post_data_json["offer"]["sdp"])
                    if r.url.endswith("/v1/cli/tunnel/session") and r.method == "POST" else None)
            open_terminal(page, hub, "term-on")
            page.wait_for_selector("#terminal-state[data-state=connected]", timeout=30_000)
            page.click("#terminal-screen")
            page.keyboard.type("echo relayed-$((20+3))\n")
            wait_screen(page, r"^relayed-23$")
            page.click("#terminal-close")
            page.wait_for_selector("#terminal-state[data-state=closed]")
        finally:
            browser.close()
    finally:
        restrict_host_addresses(["127.0.0.1"])
    # the page's own offer carried its relay candidate (gathered with GET /v1/cli/tunnel/ice-servers)
    assert offers and all("typ relay" in sdp for sdp in offers), offers
    sid = sessions(hub, "term-on")[before]["id"]

    async def ended():
        with trio.fail_after(20):
            while True:
                row = await hub.hub.services.db.fetchrow("SELECT * FROM tunnel_sessions WHERE id = $1", sid)
                if row["state"] not in ("opening", "open") and row["bytes_in"]:
                    return dict(row)
                await trio.sleep(0.1)

    row = hub.run(ended)
    assert row["relay_allowed"] and row["relayed_bytes"] > 0, row


def test_the_page_renews_the_grant_past_its_first_expiry(tpage, terminal_hub):
    page, hub = tpage, terminal_hub
    before = len(sessions(hub, "term-on"))
    open_terminal(page, hub, "term-on")
    page.wait_for_selector("#terminal-state[data-state=connected]")
    first = sessions(hub, "term-on")[before]
    page.wait_for_timeout(GRANT_SECONDS * 2 * 1000)  # two grant windows: renewed twice, or closed
    assert page.get_attribute("#terminal-state", "data-state") == "connected", page.text_content("#terminal-state")
    page.click("#terminal-screen")
    page.keyboard.type("echo still-$((1+1))\n")
    wait_screen(page, r"^still-2$")
    row = sessions(hub, "term-on")[before]
    assert row["state"] == "open" and row["expires_at"] > first["expires_at"], (first, row)
