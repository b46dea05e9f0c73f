"""The layers of docs/architecture.md hold: ``lint-imports`` checks the contracts in .importlinter.

The second test shows the layer contract is not vacuous: the same contracts (their exceptions left
out) over a tiny tree of our five package names, where actors imports the hub, must fail.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(cwd: Path, config: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([str(LINT), "--config", str(config), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold():
    done = lint(ROOT, ROOT / ".importlinter")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "broken" in done.stdout and " 0 broken" in done.stdout


def test_a_new_wrong_arrow_breaks_the_layer_contract(tmp_path):
    for package, imports in {"hub": "", "actors": "import hub.thing\n", "storage": "", "webrtc": "",
                             "device_client": "import webrtc.thing\n"}.items():
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "thing.py").write_text(imports)
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    layers = {k: v for k, v in config["importlinter:contract:layers"].items() if k != "ignore_imports"}
    out = configparser.ConfigParser()
    out["importlinter"] = {"root_packages": config["importlinter"]["root_packages"]}
    out["importlinter:contract:layers"] = layers
    with open(tmp_path / "contracts.ini", "w") as f:
        out.write(f)
    done = lint(tmp_path, tmp_path / "contracts.ini")
    assert done.returncode != 0
    assert "actors.thing -> hub.thing" in done.stdout and "device_client.thing -> webrtc.thing" in done.stdout


def test_a_hub_import_on_the_device_side_breaks_the_agent_contract(tmp_path):
    # the device side as a tiny tree: the kit's module imports quart, `fleethub tunnel` imports asyncpg
    files = {"hub/__init__.py": "", "actors/__init__.py": "", "storage/__init__.py": "", "webrtc/__init__.py": "",
             "device_client/__init__.py": "", "device_client/thing.py": "import quart\n",
             "webrtc/device_tunnel.py": "import device_client.thing\n", "webrtc/cli_tunnel.py": "import asyncpg\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    out = configparser.ConfigParser()
    out["importlinter"] = dict(config["importlinter"])
    out["importlinter:contract:agent-without-hub"] = dict(config["importlinter:contract:agent-without-hub"])
    with open(tmp_path / "contracts.ini", "w") as f:
        out.write(f)
    done = lint(tmp_path, tmp_path / "contracts.ini")
    assert done.returncode != 0
    assert "device_client.thing -> quart" in done.stdout and "webrtc.cli_tunnel -> asyncpg" in done.stdout, done.stdout


def test_authentication_importing_tunnels_breaks_its_contract(tmp_path):
    # the cycle issue 34 removed, as a tiny tree: the middleware reaching for the tunnel token's module
    files = {"hub/__init__.py": "", "hub/auth/__init__.py": "", "hub/tunnels/__init__.py": "",
             "hub/tunnels/auth.py": "", "hub/auth/middleware.py": "def f():\n    from hub.tunnels import auth\n",
             "actors/__init__.py": "", "storage/__init__.py": "", "webrtc/__init__.py": "",
             "device_client/__init__.py": ""}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    out = configparser.ConfigParser()
    out["importlinter"] = dict(config["importlinter"])
    out["importlinter:contract:auth-knows-no-tunnels"] = dict(config["importlinter:contract:auth-knows-no-tunnels"])
    with open(tmp_path / "contracts.ini", "w") as f:
        out.write(f)
    done = lint(tmp_path, tmp_path / "contracts.ini")
    assert done.returncode != 0
    assert "hub.auth.middleware -> hub.tunnels.auth" in done.stdout, done.stdout
