"""``fleethub agent --check`` as a device maker runs it: a process against a real hub, one line per
check, the exit status. And the judgements behind the lines, without IO."""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
from pathlib import Path

import trio

from device_client import check
from device_client.check import HubAnswer, judge_clock, read_token
from tests.hubtools import start_agent, start_hub

ROOT = Path(__file__).resolve().parents[2]
FLEETHUB = [sys.executable, "-m", "hub.cli"]
CHECKS = ["token", "hub", "clock", "data dir", "device root", "workload", "tunnels", "containers"]


def _as_unprivileged_owner() -> list[str]:
    """The tests run as root, which reads and writes anything: drop the capabilities that let it, so
    file modes hold for it as for any owner (setpriv, util-linux)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


async def _run_check(*args: str, prefix: list[str] | None = None) -> tuple[int, dict[str, str], str]:
    """Run the check as a process; (exit status, {check: "ok" | "FAIL"}, its output)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLEETHUB_DEVICE_TOKEN", None)
    env.pop("FLEETHUB_WORKLOAD_USER", None)
    done = await trio.run_process([*(prefix or []), *FLEETHUB, "agent", "--check", *args], cwd=ROOT, env=env,
                                  capture_stdout=True, capture_stderr=True, check=False)
    out = done.stdout.decode()
    verdicts = {name: status for status, name in re.findall(r"^(ok|FAIL) +([a-z ]+):", out, re.M)}
    return done.returncode, verdicts, out + done.stderr.decode()


async def _device(nursery, db_url, tmp_path) -> tuple[object, str, Path]:
    hub = await start_hub(nursery, db_url, tmp_path / "hub")
    _, token = await hub.provision("checked")
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    return hub, token, token_file


def _only_failure(verdicts: dict[str, str], name: str) -> None:
    assert list(verdicts) == CHECKS
    assert {n for n, v in verdicts.items() if v == "FAIL"} == {name}


async def test_every_check_passes_and_a_running_agent_keeps_its_link(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, token, token_file = await _device(nursery, db_url, tmp_path)
        data = tmp_path / "device"
        running = await start_agent(nursery, hub.base_url, token, data)
        link = next(iter(hub.services.links.values()))
        before = sorted(p.name for p in data.rglob("*"))

        code, verdicts, out = await _run_check("--hub", hub.base_url, "--token-file", str(token_file),
                                               "--data-dir", str(data), "--workload-user", "nobody",
                                               "--tunnel-target", "web=127.0.0.1:80")
        assert code == 0, out
        assert verdicts == {name: "ok" for name in CHECKS}, out
        assert f"ok   token: read from {token_file}\n" in out
        assert f"ok   hub: {hub.base_url} accepted the token\n" in out
        assert re.search(r"^ok   clock: \d+\.\d s (ahead of|behind) the hub", out, re.M), out
        assert "ok   workload: runs as nobody (uid 65534" in out
        assert "ok   containers: none (no --containers): versions with containers are rejected\n" in out
        assert token not in out
        # the probe files are gone, and the agent's link was not taken over: same link, one welcome
        assert sorted(p.name for p in data.rglob("*")) == before
        assert list(hub.services.links.values()) == [link] and not link.cancel_scope.cancel_called
        assert running.agent.connected and running.agent.statistics().links == 1


async def test_a_wrong_token_fails_the_hub_check(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, _, token_file = await _device(nursery, db_url, tmp_path)
        token_file.write_text("dev_not-this-devices-token\n")
        code, verdicts, out = await _run_check("--hub", hub.base_url, "--token-file", str(token_file),
                                               "--data-dir", str(tmp_path / "device"))
        assert code == 1, out
        _only_failure(verdicts, "hub")  # the refusal still carries the hub's Date: the clock is checked
        assert f"FAIL hub: {hub.base_url} refused the token (HTTP 401)" in out
        assert "dev_not-this" not in out


async def test_an_unreadable_token_file_fails(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, token, token_file = await _device(nursery, db_url, tmp_path)
        token_file.chmod(0o000)
        code, verdicts, out = await _run_check("--hub", hub.base_url, "--token-file", str(token_file),
                                               "--data-dir", str(tmp_path / "device"),
                                               prefix=_as_unprivileged_owner())
        assert code == 1, out
        assert verdicts["token"] == verdicts["hub"] == "FAIL", out  # no token: nothing for the hub to accept
        assert f"FAIL token: cannot read {token_file}: Permission denied" in out
        assert token not in out


async def test_a_missing_workload_account_fails(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, _, token_file = await _device(nursery, db_url, tmp_path)
        code, verdicts, out = await _run_check("--hub", hub.base_url, "--token-file", str(token_file),
                                               "--data-dir", str(tmp_path / "device"),
                                               "--workload-user", "fleethub-no-such-user")
        assert code == 1, out
        _only_failure(verdicts, "workload")
        assert "FAIL workload: no user 'fleethub-no-such-user' on this system" in out


async def test_an_unwritable_data_dir_fails_and_leaves_nothing(nursery, db_url, tmp_path):
    with trio.fail_after(60):
        hub, _, token_file = await _device(nursery, db_url, tmp_path)
        data = tmp_path / "device"
        (data / "root").mkdir(parents=True)
        data.chmod(0o500)
        try:
            code, verdicts, out = await _run_check("--hub", hub.base_url, "--token-file", str(token_file),
                                                   "--data-dir", str(data), prefix=_as_unprivileged_owner())
        finally:
            data.chmod(0o700)
        assert code == 1, out
        _only_failure(verdicts, "data dir")
        assert f"FAIL data dir: {data} is not writable: Permission denied" in out
        assert [p.name for p in data.iterdir()] == ["root"]


async def test_an_unreachable_hub_fails_the_hub_and_the_clock(tmp_path):
    with trio.fail_after(30):
        listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        port = listener.socket.getsockname()[1]
        await listener.aclose()  # a port nothing listens on
        code, verdicts, out = await _run_check("--hub", f"http://127.0.0.1:{port}", "--token", "dev_x",
                                               "--data-dir", str(tmp_path / "device"))
        assert code == 1, out
        assert {n for n, v in verdicts.items() if v == "FAIL"} == {"hub", "clock"}, out
        assert f"FAIL hub: http://127.0.0.1:{port} unreachable:" in out


# ---- the judgements ----

AT = dt.datetime(2026, 11, 27, 12, 0, 0, tzinfo=dt.timezone.utc)


def _answer(device_offset: float) -> HubAnswer:
    # the hub said 12:00:00 (meaning some instant in that second); the device read its clock then
    return HubAnswer("http://hub", 101, "Fri, 27 Nov 2026 12:00:00 GMT", AT + dt.timedelta(seconds=device_offset))


def test_the_clock_is_judged_against_the_hubs_date_within_the_grants_tolerance():
    assert judge_clock([_answer(0.5)]).ok and "0.0 s ahead of the hub" in judge_clock([_answer(0.5)]).detail
    assert judge_clock([_answer(30.5)]).ok
    late = judge_clock([_answer(31.6)])
    assert not late.ok and "31.1 s ahead of the hub" in late.detail and "timedatectl" in late.detail
    early = judge_clock([_answer(-40.0)])
    assert not early.ok and "40.5 s behind the hub" in early.detail
    # the first answer with a usable Date counts; none at all is a failure, not a pass
    assert judge_clock([HubAnswer("http://a", None, error="refused"), _answer(0.5)]).ok
    assert not judge_clock([HubAnswer("http://a", None, error="refused")]).ok
    assert not judge_clock([HubAnswer("http://a", 101, "not a date", AT)]).ok


def test_the_clock_tolerance_is_the_tunnel_grants():
    from webrtc.grant import NOT_BEFORE_SKEW

    assert check.MAX_CLOCK_SKEW == NOT_BEFORE_SKEW.total_seconds()


def test_a_token_file_others_can_read_fails_without_showing_the_token(tmp_path):
    path = tmp_path / "token"
    path.write_text("dev_secret\n")
    path.chmod(0o644)
    token, outcome = read_token(None, str(path), {})
    assert token == "dev_secret" and not outcome.ok
    assert outcome.line() == f"FAIL token: {path} is readable by group or others (mode 0644): chmod 600 it"
    path.chmod(0o600)
    assert read_token(None, str(path), {})[1].line() == f"ok   token: read from {path}"
    path.write_text("\n")
    assert read_token(None, str(path), {}) == (None, check.Outcome(False, "token", f"{path} is empty"))


def test_the_token_comes_from_where_the_agent_takes_it(tmp_path):
    assert read_token(None, None, {"FLEETHUB_DEVICE_TOKEN": "dev_env"})[0] == "dev_env"
    assert read_token("dev_flag", None, {"FLEETHUB_DEVICE_TOKEN": "dev_env"})[0] == "dev_flag"
    token, outcome = read_token(None, None, {})
    assert token is None and not outcome.ok and "FLEETHUB_DEVICE_TOKEN" in outcome.detail


def test_the_probe_leaves_nothing_and_touches_nothing_there(tmp_path):
    (tmp_path / "kept").write_text("x")
    assert check.probe_dir(tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    assert check.probe_dir(tmp_path / "absent") == "No such file or directory"


async def test_podman_is_checked_with_the_agents_containers_conf(nursery, db_url, tmp_path):
    """--containers podman: podman must answer as the agent will call it (its containers.conf too)."""
    from tests.containertools import require_tools, write_conf

    require_tools()
    with trio.fail_after(60):
        hub, _, token_file = await _device(nursery, db_url, tmp_path)
        common = ("--hub", hub.base_url, "--token-file", str(token_file), "--data-dir", str(tmp_path / "device"),
                  "--containers", "podman")
        code, verdicts, out = await _run_check(*common, "--containers-conf", str(write_conf(tmp_path / "conf")))
        assert code == 0 and verdicts["containers"] == "ok", out
        assert re.search(r"^ok   containers: podman \d+\.\d+\S* with \S+ version", out, re.M), out

        bad = tmp_path / "bad.conf"
        bad.write_text('[engine]\nruntime = "fleethub-no-such-runtime"\n')
        code, verdicts, out = await _run_check(*common, "--containers-conf", str(bad))
        assert code == 1, out
        _only_failure(verdicts, "containers")
        assert 'FAIL containers: podman version: Error: default OCI runtime "fleethub-no-such-runtime" not found' in out

        code, verdicts, out = await _run_check(*common, "--containers-conf", str(tmp_path / "absent.conf"))
        _only_failure(verdicts, "containers")
        assert f"FAIL containers: cannot read the containers.conf {tmp_path / 'absent.conf'}" in out
