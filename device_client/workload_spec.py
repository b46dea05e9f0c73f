"""What a configuration asks a device to run: ``spec.workload``, parsed and checked, and what a
health check says (device_client/workload.py runs the command and checks it).

``spec.workload`` of a configuration version::

    {"command": [argv...], "env": {NAME: value},
     "healthCheck": {"command": [argv...] | null, "timeoutSeconds": 10, "graceSeconds": 1}}

No ``workload`` in the spec means there is nothing to run, and the device is always healthy. When
``spec.workload.healthCheck`` is absent, a top-level ``spec.healthCheck`` object is read (leniently:
fields of other shapes are ignored, since that key may mean something else to other tools).

Healthy means: the process has stayed up for ``graceSeconds`` and the health-check command, if any,
exits 0 within ``timeoutSeconds``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

DEFAULT_HEALTH_TIMEOUT = 10.0
DEFAULT_GRACE = 1.0
# How much longer than its own timeout a health check may take when no check completed before the
# deadline: the engine or the system starting it on a loaded device (containers.py, workload.py).
UNSEEN_CHECK_SLACK = 15.0
MAX_HEALTH_TIMEOUT = 600.0


@dataclass(frozen=True)
class WorkloadSpec:
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, hash=False)
    health_command: tuple[str, ...] | None = None
    timeout: float = DEFAULT_HEALTH_TIMEOUT
    grace: float = DEFAULT_GRACE


@dataclass(frozen=True)
class Health:
    healthy: bool
    detail: str
    #: the end of what the failing health check printed (logtail.visible), None when it printed nothing
    output: str | None = field(default=None, compare=False)

    def event(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "detail": self.detail}


def _argv(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value) or not value[0]:
        raise ValueError(f"{what} must be a non-empty list of strings")
    if any("\0" in a for a in value):
        raise ValueError(f"{what} must not contain NUL characters")
    return tuple(value)


def _seconds(value: Any, default: float, what: str, low: float, strict: bool) -> float:
    if value is None:
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low <= value <= MAX_HEALTH_TIMEOUT:
        return float(value)
    if strict:
        raise ValueError(f"{what} must be a number from {low:g} to {MAX_HEALTH_TIMEOUT:g}")
    return default


def parse_spec(spec: Mapping[str, Any] | None) -> WorkloadSpec | None:
    """The workload of a configuration spec; None when it has none. ValueError says what is wrong."""
    workload = (spec or {}).get("workload")
    if workload is None:
        return None
    if not isinstance(workload, dict):
        raise ValueError("workload must be an object")
    command = _argv(workload.get("command"), "workload.command")
    env = workload.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("workload.env must map names to strings")
    if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in env.items()):
        raise ValueError("workload.env has an invalid name or value")
    check, strict = workload.get("healthCheck"), True
    if check is None:
        check, strict = (spec or {}).get("healthCheck"), False
    if check is None or (not strict and not isinstance(check, dict)):
        check = {}
    if not isinstance(check, dict):
        raise ValueError("workload.healthCheck must be an object")
    health_command = check.get("command")
    if health_command is not None:
        try:
            health_command = _argv(health_command, "workload.healthCheck.command")
        except ValueError:
            if strict:
                raise
            health_command = None
    return WorkloadSpec(command=command, env=dict(env), health_command=health_command,
                        timeout=_seconds(check.get("timeoutSeconds"), DEFAULT_HEALTH_TIMEOUT,
                                         "healthCheck.timeoutSeconds", 0.001, strict),
                        grace=_seconds(check.get("graceSeconds"), DEFAULT_GRACE,
                                       "healthCheck.graceSeconds", 0.0, strict))
