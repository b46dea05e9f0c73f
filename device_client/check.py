"""``fleethub agent --check``: can this device run the agent as it is configured? One line per check,
``ok`` or ``FAIL``, and a non-zero exit when any failed (docs/agent.md, "Checking a device").

The checks take the agent's own flags, so the line in the systemd unit can be checked as it stands:

- token: readable from --token, --token-file or FLEETHUB_DEVICE_TOKEN, in that order (as the agent
  reads it), and a file holding it is not readable by group or others;
- hub: every hub URL answers the device link's upgrade and accepts the token;
- clock: the device's wall clock against the hub's ``Date`` header;
- data dir and device root: a probe file can be created and removed in each;
- workload: the workload account exists, and the agent can switch to it;
- tunnels: the tunnel flags parse (targets, the shell user exists);
- containers: with ``--containers podman``, podman answers (its version and ``podman info``, which
  reads its storage and runtime configuration, --containers-conf included) as the agent will call it.

The hub check opens ``/v1/device/link`` with the token and closes it before sending a hello. The hub
checks the token before it accepts the upgrade (hub/api/link.py ``device_link``: 401 refused) and
takes over a device's link only after a hello, so a check run beside the device's running agent
leaves that agent's link alone: the hub sees a connection that leaves before its hello, nothing
else. The hub has no device HTTP endpoint that only authenticates (its one device endpoint uploads
memory-test page maps), so the upgrade is the probe.

Nothing here prints a token or a file's contents; only paths, modes and the OS's reasons.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import trio
from trio_websocket import ConnectionRejected, ConnectionTimeout, HandshakeError, open_websocket_url

from .shared import protocol
from .agentconfig import hub_urls, link_url
from .shared.clock import Clock
from .shared.paths import PLATFORM_DIR
from .devroot import DeviceRoot
from .tlsprobe import tls_refusal
from .tunnel import TunnelConfig
from .workload_account import configured_user

TOKEN_ENV = "FLEETHUB_DEVICE_TOKEN"
HUB_TIMEOUT = 10.0  # seconds to connect and finish the upgrade, per hub URL

# Tunnel grants carry a notBefore that a device accepts up to 30 s early (webrtc/grant.py,
# NOT_BEFORE_SKEW; tests/device_client/test_agent_check.py keeps the two equal): a device clock further
# behind than that refuses fresh grants, one as far ahead ends tunnels early (expiresAt by its clock).
MAX_CLOCK_SKEW = 30.0
DATE_RESOLUTION = 1.0  # an HTTP Date counts whole seconds

PROBE_PREFIX = ".fleethub-check-"


@dataclass(frozen=True)
class Outcome:
    ok: bool
    name: str
    detail: str

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAIL':<4} {self.name}: {self.detail}"


@dataclass(frozen=True)
class HubAnswer:
    """What one hub URL said to the upgrade: ``status`` 101 accepted, an HTTP status refused, None
    when nothing answered (``error`` says why); ``date`` its Date header and when it arrived."""

    url: str
    status: int | None
    date: str | None = None
    received: dt.datetime | None = None
    error: str | None = None


# ---- the judgements: pure, each one line ----

def read_token(token: str | None, token_file: str | None, environ: dict[str, str]) -> tuple[str | None, Outcome]:
    """The token as the agent reads it, and the line that says where it came from."""
    if token:
        return token, Outcome(True, "token", "given with --token (visible in ps: prefer --token-file)")
    if token_file:
        path = Path(token_file)
        try:
            mode = path.stat().st_mode
            value = path.read_text().strip()
        except OSError as exc:
            return None, Outcome(False, "token", f"cannot read {path}: {exc.strerror}")
        except UnicodeDecodeError:
            return None, Outcome(False, "token", f"{path} is not text")
        if not value:
            return None, Outcome(False, "token", f"{path} is empty")
        if mode & 0o077:
            # anyone who can read it can be this device
            return value, Outcome(False, "token", f"{path} is readable by group or others (mode "
                                                  f"{stat.S_IMODE(mode):04o}): chmod 600 it")
        return value, Outcome(True, "token", f"read from {path}")
    if environ.get(TOKEN_ENV):
        return environ[TOKEN_ENV], Outcome(True, "token", f"from {TOKEN_ENV}")
    return None, Outcome(False, "token", f"none given: --token-file, --token or {TOKEN_ENV}")


def judge_hub(answer: HubAnswer, token_checked: bool) -> Outcome:
    if answer.status is None:
        return Outcome(False, "hub", f"{answer.url} unreachable: {answer.error}")
    if not token_checked:
        return Outcome(False, "hub", f"{answer.url} answered, but no token was there to check")
    if answer.status == 101:
        return Outcome(True, "hub", f"{answer.url} accepted the token")
    if answer.status in (401, 403):
        return Outcome(False, "hub", f"{answer.url} refused the token (HTTP {answer.status}): a wrong "
                                     "token, or the device was deleted")
    return Outcome(False, "hub", f"{answer.url} answered HTTP {answer.status} to the device link")


def judge_clock(answers: Iterable[HubAnswer]) -> Outcome:
    """The device clock against the first hub Date header there is."""
    for answer in answers:
        if answer.date is None or answer.received is None:
            continue
        try:
            hub_time = email.utils.parsedate_to_datetime(answer.date)
        except (TypeError, ValueError):
            continue
        if hub_time.tzinfo is None:
            continue
        # the hub's instant lies within the second its Date names: the middle of it is the estimate
        skew = (answer.received - hub_time).total_seconds() - DATE_RESOLUTION / 2
        side = "ahead of" if skew >= 0 else "behind"
        detail = (f"{abs(skew):.1f} s {side} the hub (within {DATE_RESOLUTION / 2:.1f} s: the hub's Date "
                  "header counts whole seconds)")
        if abs(skew) > MAX_CLOCK_SKEW:
            return Outcome(False, "clock", f"{detail}; more than {MAX_CLOCK_SKEW:.0f} s breaks tunnel "
                                           "grants: enable NTP (timedatectl set-ntp true)")
        return Outcome(True, "clock", detail)
    return Outcome(False, "clock", "not compared: no hub answered with a Date header")


def probe_dir(path: Path) -> str | None:
    """Write a file in ``path`` and remove it through the code the agent's own writes use
    (devroot.py: a temporary file made O_EXCL|O_NOFOLLOW in the directory's descriptor, fsynced and
    renamed); None when that worked, else the reason. The name is random, so nothing that was there
    is touched."""
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return exc.strerror
    name = f"{PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        DeviceRoot.replace(dir_fd, name, b"probe\n", 0o600)
    except OSError as exc:
        os.close(dir_fd)
        return exc.strerror
    try:
        DeviceRoot.remove(dir_fd, name)
    except OSError as exc:
        return f"the probe {name} could not be removed: {exc.strerror}"
    finally:
        os.close(dir_fd)
    return None


def check_dirs(data_dir: Path, device_root: Path | None = None) -> list[Outcome]:
    """The data dir (state, identity key, manifests) and where delivered files land: the device root
    below the data dir by default, or ``--device-root``'s platform directory (``/var/lib/fleethub``
    under it: every device writes there, and a sandbox leaves the rest of ``/`` read-only)."""
    outcomes = _check_data_dir(data_dir)
    if device_root is None:
        root = data_dir / "root"  # state.DeviceStore's root
        if not data_dir.is_dir() or not root.exists():
            return outcomes + [Outcome(True, "device root", f"{root}: made at the first start")]
        problem = probe_dir(root)
        return outcomes + [Outcome(problem is None, "device root", f"{root} is not writable: {problem}" if problem
                                   else f"{root} is writable")]
    platform = device_root / PLATFORM_DIR.lstrip("/")
    if platform.is_dir():
        problem = probe_dir(platform)
        return outcomes + [Outcome(problem is None, "device root",
                                   f"{platform} (the platform directory) is not writable: {problem}" if problem
                                   else f"{device_root}: {platform} (the platform directory) is writable")]
    parent = next((p for p in platform.parents if p.exists()), Path("/"))
    problem = probe_dir(parent)
    return outcomes + [Outcome(problem is None, "device root",
                               f"{platform} does not exist and cannot be made in {parent}: {problem}" if problem
                               else f"{device_root}: {platform} is made at the first start")]


def _check_data_dir(data_dir: Path) -> list[Outcome]:
    if not data_dir.exists():
        # the agent makes it at its first start (under systemd, StateDirectory= makes the data dir)
        parent = next((p for p in data_dir.parents if p.exists()), Path("/"))
        problem = probe_dir(parent)
        if problem:
            return [Outcome(False, "data dir", f"{data_dir} does not exist and cannot be made in {parent}: "
                                               f"{problem}")]
        return [Outcome(True, "data dir", f"{data_dir} does not exist yet; the agent makes it at its first "
                                          "start")]
    if not data_dir.is_dir():
        return [Outcome(False, "data dir", f"{data_dir} is not a directory")]
    problem = probe_dir(data_dir)
    return [Outcome(problem is None, "data dir", f"{data_dir} is not writable: {problem}" if problem
                    else f"{data_dir} is writable")]


def check_workload(name: str | None) -> Outcome:
    try:
        user = configured_user(name)
    except ValueError as exc:
        return Outcome(False, "workload", str(exc))
    if user is None:
        return Outcome(True, "workload", f"no workload user configured: workloads run as the agent's own "
                                         f"user (uid {os.geteuid()})")
    if user.is_other() and os.geteuid() != 0:
        return Outcome(False, "workload", f"runs as {user.name} (uid {user.uid}), but the agent runs as uid "
                                          f"{os.geteuid()} and cannot switch to it: run the agent as root")
    return Outcome(True, "workload", f"runs as {user.name} (uid {user.uid}, gid {user.gid})")


def check_tunnels(args: Any) -> Outcome:
    try:
        config = TunnelConfig.from_flags(args.tunnel_target, args.tunnel_allow_port, args.ssh,
                                         args.tunnel_shell, args.tunnel_shell_user)
    except ValueError as exc:
        return Outcome(False, "tunnels", str(exc))
    return Outcome(True, "tunnels", config.describe())


async def check_containers(args: Any) -> Outcome:
    if not getattr(args, "containers", None):
        return Outcome(True, "containers", "none (no --containers): versions with containers are rejected")
    from .agent_cli import container_options
    from .engine.base import EngineError

    conf = getattr(args, "containers_conf", None)
    if conf and not os.access(conf, os.R_OK):
        return Outcome(False, "containers", f"cannot read the containers.conf {conf}")
    engine = container_options(args)["container_engine"]
    try:
        with trio.fail_after(HUB_TIMEOUT * 3):
            name, version = await engine.version()
            runtime = await engine.runtime()
    except EngineError as exc:
        return Outcome(False, "containers", f"{exc} (docs/containers.md, \"What the device needs\")")
    except trio.TooSlowError:
        return Outcome(False, "containers", f"podman did not answer within {HUB_TIMEOUT * 3:g} s")
    return Outcome(True, "containers", f"{name} {version} with {runtime}")


# ---- the IO edge ----

def _date(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    for key, value in headers or ():
        if key.lower() == b"date":
            return value.decode("latin-1")
    return None


async def ask_hub(url: str, token: str | None, *, clock: Clock, timeout: float = HUB_TIMEOUT,
                  ssl_context: Any = None) -> HubAnswer:
    """Open the device link with ``token`` and close it before the hello (the module's docstring)."""
    headers = [(protocol.TOKEN_HEADER.lower().encode(), b"Bearer " + token.encode())] if token else []
    try:
        async with open_websocket_url(link_url(url), ssl_context, extra_headers=headers,
                                      connect_timeout=timeout, disconnect_timeout=2) as ws:
            received = clock.now()
            answer = HubAnswer(url, 101, _date(ws.handshake_headers), received)
            await ws.aclose(1000, "fleethub agent --check")
            return answer
    except ConnectionRejected as exc:
        return HubAnswer(url, exc.status_code, _date(exc.headers or ()), clock.now())
    except (HandshakeError, OSError, trio.TooSlowError) as exc:
        # trio-websocket wraps the OSError that says what went wrong ("connection refused")
        reason = exc.__cause__ or exc
        error = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        if isinstance(exc, ConnectionTimeout):  # maybe TLS in disguise (device_client/tlsprobe.py)
            error = await tls_refusal(link_url(url), ssl_context, timeout) or error
        return HubAnswer(url, None, error=error)


async def _ask_hubs(urls: list[str], token: str | None) -> list[HubAnswer]:
    clock = Clock()
    return [await ask_hub(url, token, clock=clock) for url in urls]


def run(args: Any, environ: dict[str, str] | None = None) -> list[Outcome]:
    """Every check of ``fleethub agent`` ``args``; prints nothing."""
    environ = dict(os.environ if environ is None else environ)
    token, token_outcome = read_token(args.token, args.token_file, environ)
    outcomes = [token_outcome]
    try:
        urls = hub_urls(args.hub)
    except ValueError as exc:
        outcomes.append(Outcome(False, "hub", str(exc)))
        answers: list[HubAnswer] = []
    else:
        answers = trio.run(_ask_hubs, urls, token)
        outcomes += [judge_hub(answer, token is not None) for answer in answers]
    outcomes.append(judge_clock(answers))
    root = getattr(args, "device_root", None)
    outcomes += check_dirs(Path(args.data_dir), Path(root) if root else None)
    outcomes.append(check_workload(args.workload_user))
    outcomes.append(check_tunnels(args))
    outcomes.append(trio.run(check_containers, args))
    return outcomes


def main(args: Any) -> int:
    """Print one line per check; 0 when all passed, else 1."""
    outcomes = run(args)
    for outcome in outcomes:
        print(outcome.line(), flush=True)
    return 0 if all(o.ok for o in outcomes) else 1
