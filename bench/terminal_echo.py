"""Browser terminal keystroke echo: browser -> device -> browser on loopback (issue 18, Measure).

    python bench/terminal_echo.py [--smoke] [--keys 300]

A hub in its own process (``fleethub serve``, embedded PostgreSQL), ``fleethub agent --tunnel-shell``
in another (ICE on 127.0.0.1), and Debian's Chromium driven by Playwright, signed in as an operator
on the device page with the terminal open (hub/console/static/terminal.js). Each keystroke is one
byte handed to the page's ``shell`` data channel exactly as a key press is (the session's ``send``:
credit, then ``channel.send``); its round trip ends when the channel's next message carrying that
byte arrives back (the PTY's echo from bash's line editor). ``--keys`` keystrokes, 20 ms apart (a
fast typist), timed in the page with ``performance.now()``; p50/p95/max. The time xterm.js then
takes to paint is not included (it is the same for any transport). Chromium is launched with mDNS
host candidates off and loopback allowed (tests/browser/test_terminal.py says why). Prints the
figures and writes them to bench/RESULTS.md (``--smoke``: bench/out/RESULTS.smoke.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (CHROMIUM, CHROMIUM_ARGS, OUT_DIR, HubProcess, Verdicts, browser_missing,  # noqa: E402
                     command_line, facts_line, http_json, log, machine_facts, md_table, percentile,
                     tunnel_device, write_section)

ARGS = [*CHROMIUM_ARGS, "--disable-features=WebRtcHideLocalIpsWithMdns", "--allow-loopback-in-peer-connection"]
REPO = Path(__file__).resolve().parent.parent
AIM_P95_MS = 50.0  # a keystroke echo a typist does not notice (informative on a shared 2-core machine)

# In the page: n one-byte keystrokes through the session; each round trip in ms.
KEYSTROKES = """async (n) => {
  const s = document.querySelector('#terminal-screen').fleethubSession;
  const letters = 'abcdefghijklmnopqrstuvwxyz', times = [];
  for (let i = 0; i < n; i++) {
    const c = letters.charCodeAt(i % 26);
    const t0 = performance.now();
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no echo within 5 s')), 5000);
      const seen = (e) => {
        if (typeof e.data !== 'string' && new Uint8Array(e.data).includes(c)) {
          s.channel.removeEventListener('message', seen); clearTimeout(timer); resolve();
        }
      };
      s.channel.addEventListener('message', seen);
      s.send(new Uint8Array([c]));
    });
    times.push(performance.now() - t0);
    if (i % 60 === 59) s.send(new Uint8Array([21]));  // Ctrl-U: keep the line short
    await new Promise((r) => setTimeout(r, 20));
  }
  s.send(new Uint8Array([21]));
  return times;
}"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--keys", type=int, default=300)
    args = p.parse_args()
    if args.smoke:
        args.keys = 40
    missing = browser_missing("terminal_echo")
    if missing:
        print(missing)
        return 0
    from playwright.sync_api import sync_playwright

    facts = machine_facts()
    hub = HubProcess.start(name="terminal-hub", env={"FLEETHUB_TUNNELS": "on"})
    agent = None
    broken = False
    rtts: list[float] = []
    try:
        hub.bootstrap()
        dev_id, token, env = tunnel_device(hub, "terminal-bench")
        email, password = f"terminal-{uuid.uuid4().hex[:6]}@bench.local", uuid.uuid4().hex
        hub.admin("create-user", email, "--org", hub.org_id, "--role", "admin", "--password", password)
        with (OUT_DIR / "terminal-agent.log").open("wb") as err:
            agent = subprocess.Popen([sys.executable, "-m", "hub.cli", "agent", "--hub", hub.base_url,
                                      "--data-dir", str(hub.data_dir / "device"), "--tunnel-shell"],
                                     stdout=err, stderr=err, env=env, cwd=str(REPO))
        deadline = time.monotonic() + 60
        while True:
            status, body = http_json("GET", f"{hub.base_url}/v1/devices/{dev_id}", headers=hub.headers)
            if status == 200 and body["data"].get("online"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the agent did not come online; see bench/out/terminal-agent.log")
            time.sleep(0.2)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            context = browser.new_context(base_url=hub.base_url, viewport={"width": 1280, "height": 900})
            context.set_default_timeout(30_000)
            r = context.request.post("/v1/auth/login", data={"email": email, "password": password})
            assert r.ok, r.text()
            page = context.new_page()
            page.goto(f"/console/devices/{dev_id}")
            page.click("#terminal-open")
            page.wait_for_selector("#terminal-state[data-state=connected]")
            page.wait_for_timeout(500)  # the shell's prompt
            rtts = sorted(page.evaluate(KEYSTROKES, args.keys))
            log(f"{len(rtts)} keystrokes: p50 {percentile(rtts, 50):.2f} ms, p95 {percentile(rtts, 95):.2f} ms, "
                f"max {rtts[-1]:.2f} ms")
            browser.close()
    except Exception as exc:  # noqa: BLE001 — reported as a broken run
        log(f"terminal_echo failed: {exc!r}")
        broken = True
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(20)
        hub.stop()

    verdicts = Verdicts("terminal_echo", smoke=args.smoke)
    verdicts.at_most(f"keystroke echo p95, browser -> device -> browser ({args.keys} keys)",
                     percentile(rtts, 95) if rtts else None, AIM_P95_MS, " ms")
    rows = []
    if rtts:
        rows.append([f"keystroke echo round trip, {len(rtts)} keys 20 ms apart",
                     f"p50 {percentile(rtts, 50):.2f} ms", f"p95 {percentile(rtts, 95):.2f} ms",
                     f"max {rtts[-1]:.2f} ms"])
    body = (f"`{command_line()}`\n\n{facts_line(facts)}\n\nChromium's own RTCPeerConnection to the agent's "
            "`shell` target over loopback (host candidates, no relay); each round trip is one byte into the "
            "page's data channel until the PTY's echo of it comes back on the channel.\n\n"
            + md_table(["what", "p50", "p95", "max"], rows) + "\n\n" + verdicts.markdown() + "\n")
    print(body)
    log(f"wrote {write_section('terminal_echo', body, smoke=args.smoke)}")
    return verdicts.exit_code(broken=broken)


if __name__ == "__main__":
    sys.exit(main())
