"""``fleethub tunnel`` starts with what a tunnel needs (issue 35 item 3), and its timing line (marks.py).

ssh waits for its ProxyCommand's start on every connection: parsing ``fleethub tunnel``'s arguments
must not load the other commands' modules (the memory tester, device-test's qualify suite), and the
tunnel's own modules load pyjwt only for a renewal. A fresh interpreter shows what parsing loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from webrtc.marks import PREFIX, TIMING_ENV, Marks, parse, wanted

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from hub.cli import build_parser
args = build_parser().parse_args(["tunnel", "--stdio", "--device", "d", "--target", "ssh"])
assert "importlib.metadata" not in sys.modules  # --version's lookup, only when asked (hub/cli.py)
from webrtc import cli_tunnel, client, failures, peer  # what command() imports before the hub is asked
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in
                        ("device_client", "jwt", "numpy", "hub", "aiortc", "webrtc"))))
"""


def loaded_for_tunnel() -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=120, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def test_parsing_fleethub_tunnel_loads_no_other_commands_modules():
    loaded = loaded_for_tunnel()
    for heavy in ("device_client.memtest", "device_client.qualify", "device_client.agent_cli", "numpy",
                  "jwt", "webrtc.grant"):
        assert not any(m == heavy or m.startswith(heavy + ".") for m in loaded), (heavy, sorted(loaded))
    assert "webrtc.client" in loaded and "hub.cli" in loaded  # the probe did reach the tunnel's modules


def test_other_commands_still_get_their_arguments():
    from hub.cli import build_parser

    args = build_parser().parse_args(["agent", "--hub", "http://h", "--data-dir", "d", "--ssh"])
    assert args.ssh and args.device_side and args.func.__name__ == "cmd_agent"
    args = build_parser().parse_args(["demo", "--devices", "2"])
    assert args.devices == 2 and not args.device_side and args.func.__name__ == "cmd_demo"
    args = build_parser().parse_args(["sim", "--hub", "http://h", "--data-dir", "d"])
    assert args.device_side and args.func.__name__ == "cmd_sim"


def test_marks_keep_the_first_time_and_print_one_parsable_line(monkeypatch):
    marks = Marks()
    marks.mark("parsed")
    first = marks._at["parsed"]
    marks.mark("parsed")
    marks.mark("ready")
    line = marks.line()
    assert line.startswith(PREFIX) and "\n" not in line
    got = parse("ssh noise\n" + line + "\nmore noise\n")
    assert got is not None and got["parsed"] == first and got["ready"] >= first and got["cpu"] > 0
    assert parse("no timing here\n") is None
    monkeypatch.delenv(TIMING_ENV, raising=False)
    assert not wanted()
    monkeypatch.setenv(TIMING_ENV, "0")
    assert not wanted()
    monkeypatch.setenv(TIMING_ENV, "1")
    assert wanted()


RUN = """
import json, sys
from hub.cli import main
try:
    main(["tunnel", "--hub", "http://127.0.0.1:9", "--device", "00000000-0000-4000-8000-000000000001",
          "--target", "ssh"])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(m for m, module in sys.modules.items() if module is not None
                                                  and m.split(".")[0] in ("httpx", "click", "rich", "pygments",
                                                                          "aiortc", "trio", "attr"))}))
"""


def test_the_tunnel_command_loads_neither_trio_nor_httpx():
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLEETHUB_PAT_ID": "pat_x", "FLEETHUB_PAT_SECRET": "s",
           "FLEETHUB_ICE_ADDRESSES": "127.0.0.1"}
    env.pop("FLEETHUB_HUB_URL", None)
    done = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["code"] == 2 and "cannot reach the hub" in done.stderr, done.stderr  # it got as far as the hub
    modules = set(got["modules"])
    assert "aiortc" in modules  # it did set its peer up before it asked the hub
    # asyncio alone (client.py, hubcalls.py): trio with attrs and httpx were about a third of the
    # CLI's start before aiortc's own import
    assert not {m.split(".")[0] for m in modules} & {"trio", "attr", "httpx", "click", "rich", "pygments"}, \
        sorted(modules)
