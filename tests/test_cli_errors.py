"""How ``fleethub`` ends on an error (hub/cli.py ``main``, hub/cli_errors.py): an ordinary failure in
one line and a non-zero exit, its traceback only at --log-level DEBUG; a bug with its traceback."""

from __future__ import annotations

import errno

import pytest

from hub.cli import main
from hub.cli_errors import one_line
from hub.errors import NotFound


def fail_with(monkeypatch, exc: BaseException) -> None:
    def command(args) -> None:
        raise exc
    monkeypatch.setattr("hub.cli.cmd_admin", command)


def group(*excs: BaseException) -> BaseExceptionGroup:
    return BaseExceptionGroup("Exceptions from Trio nursery", list(excs))


def test_an_ordinary_failure_is_one_line(monkeypatch, capfd):
    fail_with(monkeypatch, group(group(NotFound("no fleet line-9"))))
    with pytest.raises(SystemExit) as info:
        main(["admin", "create-org", "acme"])
    assert info.value.code == "fleethub admin: no fleet line-9"
    assert capfd.readouterr().err == ""


def test_its_traceback_at_debug(monkeypatch, capfd):
    fail_with(monkeypatch, group(NotFound("no fleet line-9")))
    with pytest.raises(SystemExit) as info:
        main(["--log-level", "DEBUG", "admin", "create-org", "acme"])
    assert info.value.code == "fleethub admin: no fleet line-9"
    err = capfd.readouterr().err
    assert " DEBUG " in err and "Traceback" in err and "NotFound: no fleet line-9" in err


def test_a_bug_logs_its_traceback(monkeypatch, capfd):
    fail_with(monkeypatch, group(KeyError("fleet_id")))
    with pytest.raises(SystemExit) as info:
        main(["admin", "create-org", "acme"])
    assert info.value.code == 1
    err = capfd.readouterr().err
    assert " CRITICAL fleethub: fatal: 'fleet_id'" in err and "Traceback" in err and "KeyError" in err


def test_a_bug_beside_an_ordinary_failure_is_still_a_bug(monkeypatch, capfd):
    fail_with(monkeypatch, group(NotFound("no fleet"), ZeroDivisionError("division by zero")))
    with pytest.raises(SystemExit) as info:
        main(["admin", "create-org", "acme"])
    assert info.value.code == 1
    assert "ZeroDivisionError" in capfd.readouterr().err


def test_an_exit_inside_a_nursery_is_that_exit(monkeypatch, capfd):
    fail_with(monkeypatch, group(SystemExit("no organisation 7")))
    with pytest.raises(SystemExit) as info:
        main(["admin", "create-org", "acme"])
    assert info.value.code == "fleethub admin: no organisation 7"
    assert capfd.readouterr().err == ""


def test_the_lines():
    in_use = OSError(errno.EADDRINUSE, "Address already in use")
    assert one_line(in_use, "--host 127.0.0.1 --port 8080") == ("cannot listen at --host 127.0.0.1 --port 8080: "
                                                                 "another process listens there")
    assert one_line(in_use) == "Address already in use"
    # a file's permission error is not the port's, whatever the command
    denied = PermissionError(errno.EACCES, "Permission denied", "/srv/fleethub/jwt-ed25519.pem")
    assert one_line(denied, "--host 127.0.0.1 --port 80") == "Permission denied: /srv/fleethub/jwt-ed25519.pem"
    # the same failure in every device's task is said once
    assert one_line(BaseExceptionGroup("", [in_use, in_use, NotFound("no fleet")])) == \
        "Address already in use; no fleet"
    assert one_line(NotFound("no fleet\n\n")) == "no fleet"  # a peer's answer, say, ends in newlines
    assert one_line(ValueError("bad")) is None
