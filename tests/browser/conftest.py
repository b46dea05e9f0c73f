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
import shutil
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from device_client.memtest import MemtestConfig
from hub.auth.passwords import hash_password
from tests.conformance.conftest import SMALL_MEMORY, SpecHub, _create_database, _drop_database
from tests.hubtools import start_agent, start_hub

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
        return "playwright is not installed (pip install -e '.[test]')"
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
    name = _create_database(pg_server_dsn, pg_template)
    db_url = pg_server_dsn.rsplit("/", 1)[0] + "/" + name
    root = Path(tempfile.mkdtemp(prefix="fleethub-console-"))
    ready: dict[str, Any] = {}
    started, stop = threading.Event(), threading.Event()

    async def serve() -> None:
        try:
            async with trio.open_nursery() as nursery:
                with trio.fail_after(90):
                    hub = await start_hub(nursery, db_url, root / "hub", heartbeat_interval=0.5)
                    s = hub.services
                    await s.db.execute("UPDATE organizations SET tier = 'enterprise', rate_limit = 1000000 "
                                       "WHERE id = $1::uuid", hub.org_id)
                    await s.invalidate(f"org:{hub.org_id}")
                    email = f"operator-{uuid.uuid4().hex[:6]}@test.local"
                    digest = await trio.to_thread.run_sync(hash_password, PASSWORD)
                    user = await s.orgs.create_user(email, s.clock.now(), password_hash=digest)
                    await s.orgs.add_member(uuid.UUID(hub.org_id), user["id"], "admin", s.clock.now())
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
                ready.update(hub=hub, token=trio.lowlevel.current_trio_token(), email=email, agents=agents,
                             devices=devices, fleet_id=fleet_id, config_id=config_id, nursery=nursery)
                started.set()
                await trio.to_thread.run_sync(stop.wait)
                await hub.client.aclose()
                nursery.cancel_scope.cancel()
        except BaseException as exc:  # noqa: BLE001 — handed to the main thread below
            ready["error"] = exc
            started.set()

    thread = threading.Thread(target=trio.run, args=(serve,), name="console-hub", daemon=True)
    thread.start()
    started.wait(120)
    if "hub" not in ready:
        stop.set()
        raise RuntimeError(f"the console's hub did not start: {ready.get('error')!r}")
    http = httpx.Client(timeout=30)
    try:
        yield ConsoleHub(ready["hub"], ready["token"], http, ready["devices"]["lab-memory"], "",
                         {"nursery": ready["nursery"], "root": root}, email=ready["email"], agents=ready["agents"],
                         devices=ready["devices"], fleet_id=ready["fleet_id"], config_id=ready["config_id"])
    finally:
        http.close()
        stop.set()
        thread.join(30)
        _drop_database(pg_server_dsn, name)
        shutil.rmtree(root, ignore_errors=True)


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
