"""Secret-file delivery: the status of one file on one device, and reconciliation with what a device
reports it holds. Pure: no IO; storage carries out the status changes in batches.

    (new) ──upload──► PENDING ──device wrote──► ON_DEVICE
                         │    └─write failed──► FAILED ──(re)push──► PENDING
                         └─device file at same path (config file only)──► OVERRIDDEN
    any ──delete──► removed from the device

A configuration's file arrives with the device's next configuration update; a device file is pushed
shortly after it is saved. For a device that already runs the configuration, that update is a
config.apply of the same version carrying the new files (actors/device_delivery.py), sent at upload,
at hello and with a rollout; ``reconcile`` below only repairs files already delivered. When the device rejects a configuration, its files are not applied: they
fail with the rejection as their error.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum


class Delivery(Enum):
    PENDING = "pending"          #: saved in the hub, not yet confirmed by the device
    ON_DEVICE = "on_device"      #: the device wrote it (its digest matches)
    FAILED = "failed"            #: the device could not write it; the error says why
    OVERRIDDEN = "overridden"    #: a configuration file shadowed by the device's own file at its path


@dataclass(frozen=True)
class Wrote:
    sha256: str


@dataclass(frozen=True)
class WriteFailed:
    error: str


@dataclass(frozen=True)
class Reupload:
    """New contents saved for the same path."""


@dataclass(frozen=True)
class Overridden:
    """The device got its own file at this path (configuration files only)."""


@dataclass(frozen=True)
class OverrideRemoved:
    """The device's own file at this path was deleted."""


TRANSITIONS: dict[Delivery, dict[type, Delivery]] = {
    Delivery.PENDING: {Wrote: Delivery.ON_DEVICE, WriteFailed: Delivery.FAILED, Reupload: Delivery.PENDING,
                       Overridden: Delivery.OVERRIDDEN},
    Delivery.ON_DEVICE: {Reupload: Delivery.PENDING, Overridden: Delivery.OVERRIDDEN, Wrote: Delivery.ON_DEVICE,
                         WriteFailed: Delivery.FAILED},
    Delivery.FAILED: {Reupload: Delivery.PENDING, Wrote: Delivery.ON_DEVICE, WriteFailed: Delivery.FAILED,
                      Overridden: Delivery.OVERRIDDEN},
    Delivery.OVERRIDDEN: {OverrideRemoved: Delivery.PENDING, Reupload: Delivery.OVERRIDDEN},
}


class IllegalTransition(Exception):
    pass


def next_status(state: Delivery, event: object) -> Delivery:
    new = TRANSITIONS[state].get(type(event))
    if new is None:
        raise IllegalTransition(f"{type(event).__name__} is not allowed in state {state.value}")
    return new


@dataclass
class Plan:
    """What reconciling a device's reported files with the hub's expectation asks for."""
    confirm: list[str] = field(default_factory=list)   # file ids now known to be on the device
    push: list[str] = field(default_factory=list)      # file ids to (re)send: missing or different
    remove: list[str] = field(default_factory=list)    # paths on the device the hub no longer has


def reconcile(expected: list[dict], digests: dict[str, str], *, push_config_files: bool,
              keep: Iterable[str] = ()) -> Plan:
    """``expected``: files that should be on the device ({id, path, sha256, config_id?, status});
    ``digests``: path → sha256 the device reports for the files it manages; ``keep``: paths of the
    configuration the device runs, never removed here even when another configuration is assigned
    (the device runs that one until it applies the new one, and returns to it if it rejects it; the
    device itself removes them once a new configuration is applied: device_client/configs.py).

    Device files that are missing or different are pushed. A configuration's files are re-pushed only
    when ``push_config_files`` (the device runs the assigned version) and they had already been
    delivered or failed; new ones go with a config.apply (actors/device_delivery.py), not files.put.
    """
    plan = Plan()
    wanted_paths = set()
    for f in expected:
        wanted_paths.add(f["path"])
        on_device = digests.get(f["path"])
        if on_device == f["sha256"]:
            if f.get("status") != Delivery.ON_DEVICE.value:
                plan.confirm.append(str(f["id"]))
        elif f.get("config_id") is None:
            plan.push.append(str(f["id"]))
        elif push_config_files and f.get("status") != Delivery.PENDING.value:
            # Repair: it was written (or failed) with the version the device runs; a file still
            # pending goes with a config.apply instead, as the spec's configuration update.
            plan.push.append(str(f["id"]))
    wanted_paths.update(keep)
    plan.remove = sorted(p for p in digests if p not in wanted_paths)
    return plan
