"""The path and mode rules for secret files (spec: Limits), shared by the hub and the agent."""

from __future__ import annotations

import pytest

from device_client.shared import paths
from device_client.shared.paths import FORBIDDEN, PLATFORM_DIR, check_mode, check_path, classify, parse_mode
from tests.astparse import parse

SYSTEM_TREES = ["/proc", "/sys", "/dev", "/boot", "/app", "/bin", "/sbin", "/lib", "/lib64", "/usr", "/run", "/tmp"]
ACCOUNT_FILES = ["/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow", "/etc/sudoers", "/etc/fstab", "/etc/mtab"]
BOOT_FILES = ["/etc/crypttab", "/etc/inittab", "/etc/rc.local", "/etc/default/grub", "/etc/modules",
              "/etc/dracut.conf"]
BOOT_TREES = ["/etc/sudoers.d", "/etc/default/grub.d", "/etc/grub.d", "/etc/initramfs-tools",
              "/etc/dracut.conf.d", "/etc/modules-load.d", "/etc/modprobe.d", "/etc/kernel"]


def test_the_spec_list_is_all_there():
    for prefix in SYSTEM_TREES + ACCOUNT_FILES + BOOT_FILES + BOOT_TREES:
        assert prefix in FORBIDDEN


@pytest.mark.parametrize("prefix", SYSTEM_TREES + ACCOUNT_FILES + BOOT_FILES + BOOT_TREES)
def test_forbidden_prefix_itself_and_everything_under_it(prefix):
    for path in (prefix, prefix + "/x", prefix + "/a/b/c.conf", prefix + "/.hidden"):
        problem = check_path(path)
        assert problem is not None and "forbidden" in problem and prefix in problem, path


@pytest.mark.parametrize("prefix", SYSTEM_TREES + ACCOUNT_FILES + BOOT_FILES + BOOT_TREES)
def test_a_longer_name_with_the_same_start_is_allowed(prefix):
    # /usrx is not /usr; /etc/passwd- (the shadow-utils backup) is not /etc/passwd
    for suffix in ("x", "-", ".bak", "_old"):
        assert check_path(prefix + suffix) is None, prefix + suffix


@pytest.mark.parametrize("path", ["/usr/x", "/usr/local/bin/tool", "/lib64/ld-linux-x86-64.so.2", "/tmp/a",
                                  "/run/secrets/x", "/dev/null", "/proc/1/environ", "/sys/kernel/x",
                                  "/boot/grub/grub.cfg", "/app/config.yaml", "/bin/sh", "/sbin/init"])
def test_typical_system_paths_are_forbidden(path):
    assert "forbidden" in check_path(path)


@pytest.mark.parametrize("path", ["/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.preload",
                                  "/etc/ld.so.conf.d/libc.conf", "/etc/ld.so.conf.d", "/etc/ld.so.anything/x"])
def test_dynamic_loader_files_are_forbidden(path):
    assert "ld.so" in check_path(path)


@pytest.mark.parametrize("path", ["/etc/ld.so", "/etc/ld.sox", "/etc/xld.so.conf", "/opt/etc/ld.so.conf",
                                  "/etc/foo/ld.so.conf"])
def test_only_etc_ld_so_dot_names_are_the_loader(path):
    assert check_path(path) is None


@pytest.mark.parametrize("path", ["/etc/hostname", "/etc/hosts", "/etc/app/config.yaml", "/etc/ssl/private/key.pem",
                                  "/etc/passwd-", "/etc/shadow.d/x", "/etc/sudoersx", "/etc/default/grubby",
                                  "/etc/systemd/system/app.service.d/override.conf", "/opt/app/token",
                                  "/root/.ssh/authorized_keys", "/home/pi/.netrc", "/srv/x", "/var/lib/app/x",
                                  "/etc/mtab.d/x", "/x"])
def test_ordinary_paths_are_allowed(path):
    assert check_path(path) is None


def test_platform_directory_allows_only_secrets_and_volumes():
    assert PLATFORM_DIR == "/var/lib/fleethub"
    allowed = ["/var/lib/fleethub/secrets/x", "/var/lib/fleethub/secrets/db/password",
               "/var/lib/fleethub/secrets/.env", "/var/lib/fleethub/volumes/data/x",
               "/var/lib/fleethub/volumes/data/deep/er/file", "/var/lib/fleethubx/state",
               "/var/lib/fleethub-other/x", "/var/lib/fleethu/x"]
    for path in allowed:
        assert check_path(path) is None, path
    forbidden = ["/var/lib/fleethub", "/var/lib/fleethub/state", "/var/lib/fleethub/state/x",
                 "/var/lib/fleethub/secrets", "/var/lib/fleethub/volumes", "/var/lib/fleethub/volumes/data",
                 "/var/lib/fleethub/secretsx/x", "/var/lib/fleethub/volumesx/a/b", "/var/lib/fleethub/agent.key",
                 "/var/lib/fleethub/Secrets/x"]
    for path in forbidden:
        problem = check_path(path)
        assert problem is not None and "platform directory" in problem, path


@pytest.mark.parametrize("path,reason", [
    ("", "absolute"), ("etc/x", "absolute"), ("./etc/x", "absolute"), ("~/x", "absolute"),
    ("/", "not end with /"), ("/etc/app/", "not end with /"),
    ("//etc/x", "empty segment"), ("/etc//x", "empty segment"),
    ("/etc/./x", ". or .."), ("/etc/../x", ". or .."), ("/etc/app/..", ". or .."), ("/.", ". or .."),
    ("/..", ". or .."),
    ("/etc\\x", "backslash"), ("\\etc\\x", "absolute"),
    ("/etc/a\x00b", "control"), ("/etc/a\nb", "control"), ("/etc/a\tb", "control"), ("/etc/a\rb", "control"),
    ("/etc/a\x1fb", "control"), ("/etc/a\x7fb", "control"), ("/etc/a\x85b", "control"), ("/etc/a\x9fb", "control"),
    ("/etc/\ud800", "UTF-8"),
])
def test_paths_that_are_not_absolute_and_canonical(path, reason):
    problem = check_path(path)
    assert problem is not None and reason in problem, (path, problem)


@pytest.mark.parametrize("value", [None, 1, b"/etc/x", ["/etc/x"], {"path": "/etc/x"}])
def test_a_path_must_be_a_string(value):
    assert check_path(value) == "path must be a string"


def test_dots_inside_names_are_fine():
    for path in ("/etc/...", "/etc/..x", "/etc/x..", "/etc/.x", "/opt/a.b.c", "/etc/app/..."):
        assert check_path(path) is None, path


def test_length_is_counted_in_utf8_bytes():
    assert check_path("/" + "a" * 1023) is None
    assert "1025 bytes" in check_path("/" + "a" * 1024)
    segmented = "/" + "/".join(["abcdefg"] * 128)  # 1 + 128 * 8 - 1 = 1024
    assert len(segmented) == 1024 and check_path(segmented) is None
    assert check_path(segmented + "x") is not None
    # é is two bytes: 511 of them plus "/x" = 1024 bytes, one more is 1026
    assert check_path("/x" + "é" * 511) is None
    assert "1026 bytes" in check_path("/x" + "é" * 512)
    # a four-byte character straddling the limit
    assert check_path("/" + "a" * 1019 + "😀") is None
    assert check_path("/" + "a" * 1020 + "😀") is not None


def test_unicode_names_are_allowed_and_not_normalised():
    for path in ("/etc/app/clé", "/opt/日本語/設定", "/srv/😀.key", "/etc/caf\u0065\u0301"):
        assert check_path(path) is None, path
    # a non-breaking or zero-width space is not a control character
    assert check_path("/etc/a\u00a0b") is None
    assert check_path("/etc/a\u200bb") is None


def test_a_forbidden_path_cannot_hide_behind_unicode_or_case():
    assert check_path("/USR/x") is None  # Linux paths are case-sensitive: /USR is not /usr
    assert check_path("/us\u0072/x") is not None  # "r" spelled as an escape is still "r"


@pytest.mark.parametrize("mode", [0o400, 0o440, 0o444, 0o600, 0o640, 0o644, 0o700, 0o750, 0o755, 0o555, 0o500, 0o711])
def test_good_modes(mode):
    assert check_mode(mode) is None


@pytest.mark.parametrize("mode,reason", [
    (0o000, "owner read"), (0o200, "owner read"), (0o300, "owner read"), (0o044, "owner read"),
    (0o100, "owner read"),
    (0o620, "group- or world-writable"), (0o602, "group- or world-writable"), (0o666, "group- or world-writable"),
    (0o777, "group- or world-writable"), (0o660, "group- or world-writable"), (0o642, "group- or world-writable"),
    (0o4755, "setuid"), (0o2755, "setuid"), (0o1755, "sticky"), (0o4600, "setuid"), (0o7644, "setuid"),
    (0o10000, "between"), (-1, "between"), (0o17777, "between"),
])
def test_bad_modes(mode, reason):
    problem = check_mode(mode)
    assert problem is not None and reason in problem, (oct(mode), problem)


@pytest.mark.parametrize("value", [None, "0600", 6.0, True, False, [0o600]])
def test_a_mode_must_be_an_integer(value):
    assert check_mode(value) == "mode must be an integer"


def test_every_mode_is_judged_by_the_three_rules():
    for mode in range(0o10000):
        ok = bool(mode & 0o400) and not mode & 0o022 and not mode & 0o7000
        assert (check_mode(mode) is None) == ok, oct(mode)


def test_parse_mode():
    assert parse_mode("0600") == 0o600
    assert parse_mode("600") == 0o600
    assert parse_mode("0o644") == 0o644
    assert parse_mode("4755") == 0o4755  # parsed; check_mode is what refuses it
    for bad in ("", "0800", "06000", "rw-r--r--", "0x180", " 0600", "-600", "600\n"):
        with pytest.raises(ValueError):
            parse_mode(bad)


def test_classify():
    assert classify("/var/lib/fleethub/secrets/token") == "secrets"
    assert classify("/var/lib/fleethub/secrets/a/b") == "secrets"
    assert classify("/var/lib/fleethub/volumes/data/x") == "volume"
    assert classify("/etc/app/x") == "host"
    assert classify("/var/lib/fleethub-secrets/x") == "host"


def test_the_module_has_no_dependencies():
    # the hub imports it for validation; it must not pull in trio, pydantic or the agent
    import ast
    import inspect

    tree = parse(inspect.getsource(paths))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "re", "unicodedata", "typing"}
