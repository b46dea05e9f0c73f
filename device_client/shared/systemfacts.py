"""A device's system facts: what operators expect to see of a machine (uptime, addresses, CPU, memory
and disk use), sent in the hello's ``system`` and in every telemetry sample.

The model bounds each member; ``checked`` is how the hub (and the qualification kit) reads a
device's: a member out of bounds or of the wrong type is dropped, addresses past the sixteenth are
cut, and each such change comes back as a note so the caller can count it and say so. A hello that
claims fifty thousand addresses must neither cost the link nor make every read of the device large,
and an operator must learn that the device said more than was kept.

Nor may it cost the hub's event loop: parsing an address takes microseconds, and the hub checked
every one of fifty thousand, twice, for each hello and each telemetry sample (0.3 s of the loop's CPU,
found by its stall watch, device_client/shared/loopwatch.py). Now the list is read only until sixteen
distinct addresses are kept, and never past its first ``ADDRESSES_READ`` entries.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

MAX_IP_ADDRESSES = 16
ADDRESSES_READ = 4 * MAX_IP_ADDRESSES  # entries read at most: room for repeats and a few bad ones
# An address written out: the longest IPv6 text with an embedded IPv4 and a zone is under this.
_ADDRESS_MAX_CHARS = 64
# Beyond any real machine (317 years up, 8 EiB): a bound that keeps the JSON numbers small and finite.
_UPTIME_MAX = 1e10
_BYTES_MAX = 2**63 - 1


def _address(value: str) -> str:
    # canonical text, so the same address is never shown two ways
    return str(ipaddress.ip_address(value))


Address = Annotated[str, Field(max_length=_ADDRESS_MAX_CHARS), AfterValidator(_address)]
Percent = Annotated[float, Field(ge=0, le=100)]


class SystemFacts(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # "50" is not a percentage, true not a number
    uptimeSeconds: float | None = Field(None, ge=0, le=_UPTIME_MAX, description="seconds since the device booted")
    ipAddresses: list[Address] = Field(default_factory=list, max_length=MAX_IP_ADDRESSES, description=(
        f"the device's own addresses (IPv4 and IPv6, loopback and link-local left out), at most "
        f"{MAX_IP_ADDRESSES}"))
    cpuPercent: Percent | None = Field(None, description="CPU busy, 0-100: since the previous sample (since boot "
                                                         "for the first)")
    memoryPercent: Percent | None = Field(None, description="memory in use (not available), 0-100")
    memoryTotalBytes: int | None = Field(None, ge=0, le=_BYTES_MAX)
    diskPercent: Percent | None = Field(None, description="the device root's filesystem in use, 0-100, as df "
                                                          "counts it")
    diskTotalBytes: int | None = Field(None, ge=0, le=_BYTES_MAX)


def checked(raw: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """``raw`` (a device's ``system``) as SystemFacts' members, and what had to change to get there.
    None for None. Members the model does not name are left out without a note (a newer agent may
    say more); the model's own members are kept when valid, cut (addresses) or dropped."""
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        return None, [f"system: an object was expected, got {type(raw).__name__}"]
    notes: list[str] = []
    data = {name: raw[name] for name in SystemFacts.model_fields if name in raw}
    addresses = data.get("ipAddresses")
    if isinstance(addresses, list):
        kept: dict[str, None] = {}  # canonical text, in order, once each
        read = 0
        for value in addresses[:ADDRESSES_READ]:
            if len(kept) == MAX_IP_ADDRESSES:
                break
            read += 1
            canonical = _canonical(value)
            if canonical is not None:
                kept.setdefault(canonical)
        left_out = read - len(kept)
        if left_out:
            of = f"{read}" if read == len(addresses) else f"the first {read}"
            notes.append(f"system.ipAddresses: {left_out} of {of} are not addresses or repeat one, left out")
        if read < len(addresses):
            notes.append(f"system.ipAddresses: {len(addresses)} given, the first {len(kept)} kept"
                         if len(kept) == MAX_IP_ADDRESSES else
                         f"system.ipAddresses: {len(addresses)} given, those past the first {read} not read")
        data["ipAddresses"] = list(kept)
    for _ in range(len(SystemFacts.model_fields) + 1):  # each round drops a member: bounded
        try:
            return SystemFacts.model_validate(data).model_dump(), notes
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors(include_url=False, include_input=False)} & data.keys()
            for name in sorted(bad):
                notes.append(f"system.{name}: out of bounds or of the wrong type, left out")
                del data[name]
    return None, [*notes, "system: not readable, left out"]


def _canonical(value: Any) -> str | None:
    """An address's canonical text (parsed once), or None for anything that is not one."""
    if not isinstance(value, str) or len(value) > _ADDRESS_MAX_CHARS:
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None
