"""One real hub (embedded PostgreSQL, real agents on 127.0.0.1) per browser-test module, and Debian's
Chromium driven by Playwright.

The hub runs in a thread with its own trio run, as the conformance suite's does (its helpers are
shared: ``SpecHub``, the database copies); Playwright's sync API drives the browser from the test.
Tests skip, saying why, when Playwright or /usr/bin/chromium is missing (``make test`` installs both:
pyproject's test extras and the Makefile's system-deps). Screenshots go to $CONSOLE_SCREENSHOTS when
set (docs/img holds a few), else to the test session's temporary directory.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from device_client.memtest import MemtestConfig
from tests.conformance.conftest import SMALL_MEMORY, SpecHub
from tests.hubtools import start_agent, start_hub
from tests.threadhub import add_operator, hub_in_thread

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PASSWORD = "correct horse battery staple"
HEALTHY = {"command": [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
           "healthCheck": {"timeoutSeconds": 2, "graceSeconds": 0.2}}

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the test extras install it
    sync_playwright = None


def _why_no_browser() -> str | None:
    if sync_playwright is None:
        return "playwright is not installed (pip install -e '.[hub,test]')"
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing (make system-deps installs Debian's chromium)"
    return None


@dataclass
class ConsoleHub(SpecHub):
    email: str = ""
    agents: dict[str, Any] = field(default_factory=dict)   # device name -> RunningAgent
    devices: dict[str, str] = field(default_factory=dict)  # device name -> id
    fleet_id: str = ""
    config_id: str = ""


@pytest.fixture(scope="module")
def console(pg_server_dsn, pg_template):
    why = _why_no_browser()
    if why:
        pytest.skip(why)

    async def setup(nursery: trio.Nursery, db_url: str, root: Path) -> dict[str, Any]:
        hub = await start_hub(nursery, db_url, root / "hub", heartbeat_interval=0.5)
        s = hub.services
        await s.db.execute("UPDATE organizations SET tier = 'enterprise', rate_limit = 1000000 "
                           "WHERE id = $1::uuid", hub.org_id)
        await s.invalidate(f"org:{hub.org_id}")
        email = await add_operator(hub, PASSWORD)
        r = await hub.call("POST", "/v1/fleets", json={"name": "line-1"})
        fleet_id = r.json()["data"]["id"]
        r = await hub.call("POST", "/v1/configurations", json={"name": "app", "spec": {"workload": HEALTHY}})
        config_id = r.json()["data"]["id"]
        agents, devices = {}, {}
        plan = [("line-1-a", fleet_id), ("line-1-b", fleet_id), ("line-1-c", fleet_id),
                ("lab-unplug", None), ("lab-memory", None)]
        for dev_name, fid in plan:
            extra = {"fleet_id": fid} if fid else {}
            dev_id, token = await hub.provision(dev_name, **extra)
            agents[dev_name] = await start_agent(
                nursery, hub.base_url, token, root / dev_name,
                memtest=MemtestConfig(budget=SMALL_MEMORY, chunk_words=1 << 13))
            devices[dev_name] = dev_id
        return {"hub": hub, "email": email, "agents": agents, "devices": devices, "fleet_id": fleet_id,
                "config_id": config_id}

    with hub_in_thread(pg_server_dsn, pg_template, "console", setup) as ready, httpx.Client(timeout=30) as http:
        yield ConsoleHub(ready["hub"], ready["token"], http, ready["devices"]["lab-memory"], "",
                         {"nursery": ready["nursery"], "root": ready["root"]}, email=ready["email"],
                         agents=ready["agents"], devices=ready["devices"], fleet_id=ready["fleet_id"],
                         config_id=ready["config_id"])


@pytest.fixture(scope="module")
def browser(console):
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    where = os.environ.get("CONSOLE_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("console-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def page(browser, console):
    """A fresh browser context (no cookies) at 1280 px; script errors on the page fail the test."""
    context = browser.new_context(base_url=console.base_url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    # a style or script the CSP refused is only a console message: count it as an error too
    pg.on("console", lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    try:
        yield pg
    finally:
        context.close()
    assert not errors, f"script errors or CSP violations on the page: {errors}"


def sign_in(page, console, next_path: str = "") -> None:
    page.goto("/console/signin" + (f"?next={next_path}" if next_path else ""))
    page.fill("#email", console.email)
    page.fill("#password", PASSWORD)
    page.click("#signin button[type=submit]")
    page.wait_for_url("**" + (next_path or "/console/devices"))
    page.wait_for_selector("#whoami")
