"""Which device paths a secret file may be written to, and with which modes (spec: Limits).

Pure functions with no dependencies beyond the standard library: the hub imports this module to
validate uploads, and the agent runs the same checks again before it writes anything, so a hub bug
(or a forged command) cannot make a device overwrite its own system files.

Rules for a path:

- absolute and canonical: starts with ``/``, no empty (``//``), ``.`` or ``..`` segment, no trailing
  slash, no backslash, no control character (C0, DEL, C1; NUL included);
- at most 1,024 bytes in UTF-8 (and encodable in UTF-8 at all). Any other Unicode is allowed and is
  not normalised: ``/etc/é`` in NFC and NFD are two different files, as they are to the kernel.
  A path segment longer than the filesystem allows (usually 255 bytes) passes here and fails on
  the device with the OS error, like any other write error;
- not forbidden. Forbidden means the path itself *and everything under it* (a file named
  ``/etc/passwd/x`` would turn ``/etc/passwd`` into a directory on a device that lacks one):

  * system trees: /proc /sys /dev /boot /app /bin /sbin /lib /lib64 /usr /run /tmp;
  * account and privilege files: /etc/passwd /etc/shadow /etc/group /etc/gshadow /etc/sudoers
    /etc/sudoers.d;
  * the dynamic loader: every /etc entry whose name starts with ``ld.so.`` (ld.so.cache,
    ld.so.conf, ld.so.conf.d/…, ld.so.preload);
  * boot files, i.e. what decides whether the device comes back up after a reboot: /etc/fstab
    /etc/mtab /etc/crypttab /etc/inittab /etc/rc.local, the boot loader (/etc/default/grub,
    /etc/default/grub.d, /etc/grub.d), the initramfs (/etc/initramfs-tools, /etc/dracut.conf,
    /etc/dracut.conf.d), kernel modules and hooks (/etc/modules, /etc/modules-load.d,
    /etc/modprobe.d, /etc/kernel).

  Only those exact names are forbidden: /etc/passwd- (the shadow-utils backup), /usrx, /etc/hostname
  and /etc/hosts are ordinary paths. Setting a hostname or a hosts entry is fleet configuration, and
  neither stops a device from booting;
- under the platform directory /var/lib/fleethub only ``secrets/<...>/<file>`` and
  ``volumes/<volume>/<...>/<file>`` are allowed; the platform directory, ``secrets`` and
  ``volumes`` themselves and a bare ``volumes/<volume>`` (the volume's directory) are not files.

Rules for a mode: at most 0o7777, the owner can read (0o400), not group- or world-writable
(0o022), no setuid, setgid or sticky bit (0o7000).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

PLATFORM_DIR = "/var/lib/fleethub"
SECRETS_DIR = PLATFORM_DIR + "/secrets"
VOLUMES_DIR = PLATFORM_DIR + "/volumes"
MAX_PATH_BYTES = 1024

# Each entry forbids the path and every path below it.
FORBIDDEN: tuple[str, ...] = (
    "/proc", "/sys", "/dev", "/boot", "/app", "/bin", "/sbin", "/lib", "/lib64", "/usr", "/run", "/tmp",
    "/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow", "/etc/sudoers", "/etc/sudoers.d",
    "/etc/fstab", "/etc/mtab", "/etc/crypttab", "/etc/inittab", "/etc/rc.local",
    "/etc/default/grub", "/etc/default/grub.d", "/etc/grub.d",
    "/etc/initramfs-tools", "/etc/dracut.conf", "/etc/dracut.conf.d",
    "/etc/modules", "/etc/modules-load.d", "/etc/modprobe.d", "/etc/kernel",
)
_LD_SO = re.compile(r"^/etc/ld\.so\.[^/]*(?:/|$)")

MODE_MAX = 0o7777
OWNER_READ = 0o400
GROUP_OR_WORLD_WRITE = 0o022
SPECIAL_BITS = 0o7000  # setuid, setgid, sticky
_OCTAL = re.compile(r"(?:0o)?[0-7]{1,4}")

Kind = Literal["secrets", "volume", "host"]


def _control_character(path: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in path)


def check_path(path: object) -> str | None:
    """None when ``path`` may hold a secret file, else the reason it may not (one sentence)."""
    if not isinstance(path, str):
        return "path must be a string"
    if not path.startswith("/"):
        return "path must be absolute (start with /)"
    if _control_character(path):
        return "path must not contain control characters"
    if "\\" in path:
        return "path must not contain a backslash"
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        return "path must be valid UTF-8"
    if size > MAX_PATH_BYTES:
        return f"path is {size} bytes long; at most {MAX_PATH_BYTES} bytes are allowed"
    if path == "/" or path.endswith("/"):
        return "path must name a file, not end with /"
    segments = path[1:].split("/")
    if "" in segments:
        return "path must be canonical: no empty segment (//)"
    if "." in segments or ".." in segments:
        return "path must be canonical: no . or .. segment"
    for prefix in FORBIDDEN:
        if path == prefix or path.startswith(prefix + "/"):
            return f"path is forbidden: {prefix} is a system path"
    if _LD_SO.match(path):
        return "path is forbidden: /etc/ld.so.* belongs to the dynamic loader"
    if path == PLATFORM_DIR or path.startswith(PLATFORM_DIR + "/"):
        rest = path[len(PLATFORM_DIR) + 1:].split("/") if path != PLATFORM_DIR else []
        if (len(rest) >= 2 and rest[0] == "secrets") or (len(rest) >= 3 and rest[0] == "volumes"):
            return None
        return (f"path is forbidden: under the platform directory {PLATFORM_DIR} only files in "
                "secrets/ and volumes/<volume>/ are allowed")
    return None


def check_mode(mode: object) -> str | None:
    """None when ``mode`` is an allowed permission mode for a secret file, else the reason."""
    if isinstance(mode, bool) or not isinstance(mode, int):
        return "mode must be an integer"
    if not 0 <= mode <= MODE_MAX:
        return "mode must be between 0000 and 7777 (octal)"
    if mode & SPECIAL_BITS:
        return "mode must not set setuid, setgid or sticky bits"
    if mode & GROUP_OR_WORLD_WRITE:
        return "mode must not be group- or world-writable"
    if not mode & OWNER_READ:
        return "mode must let the owner read (0400)"
    return None


def parse_mode(text: str) -> int:
    """``"0600"``, ``"600"`` or ``"0o600"`` → 0o600; ValueError for anything else."""
    if not isinstance(text, str) or not _OCTAL.fullmatch(text):
        raise ValueError(f"mode must be octal permissions such as 0600, got {text!r}")
    return int(text.removeprefix("0o"), 8)


def classify(path: str) -> Kind:
    """Where a (valid) path lives: the platform secrets directory (mounted read-only into every
    workload), a custom volume (visible where that volume is mounted), or the host only."""
    if path.startswith(SECRETS_DIR + "/"):
        return "secrets"
    if path.startswith(VOLUMES_DIR + "/"):
        return "volume"
    return "host"
