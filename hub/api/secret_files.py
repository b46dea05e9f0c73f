"""Secret files of a configuration or a device (spec: Secret file; Endpoints: Secret files).

Contents are write-only: validated, encrypted (SecretBox) and stored; every response, log line and
audit entry carries metadata only. Listed per file: path, mode, owner, size, a short SHA-256
fingerprint, last update, and delivery status with the device's error when it failed (for a
configuration's file, a status over all its devices plus per-device detail).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint

from actors.device import ApplyConfig, RemoveFiles, SyncFiles
from device_client.shared.paths import check_mode, check_path
from hub.api.common import errors, jsonable, org, parse_uuid, services
from hub.api.validation import DeletedOut, body, enveloped, responds
from hub.auth.authz import Obj, authorize
from hub.errors import BadRequest, Conflict, NotFound, PayloadTooLarge
from storage.secrets import MAX_FILES, MAX_TOTAL_BYTES, LimitExceeded, Owner, OwnerMissing

MAX_FILE_BYTES = 64 * 1024
_MODE = re.compile(r"^0?[0-7]{3,4}$")

bp = Blueprint("secret_files", __name__, url_prefix="/v1")


class Upload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(..., description="absolute, canonical path on the device")
    mode: str = Field("0600", description="octal permissions")
    uid: int = Field(0, ge=0, le=2**32 - 2)
    gid: int = Field(0, ge=0, le=2**32 - 2)
    content_base64: str = Field(..., description="1 byte to 64 KB once decoded; never returned")


def _status(deliveries: list[dict]) -> tuple[str, str | None]:
    """One status over all devices: failed beats pending beats on_device; overridden only when
    every device overrides it. No device yet: pending (it arrives with the next update)."""
    statuses = {d["status"] for d in deliveries}
    if "failed" in statuses:
        return "failed", next(d["error"] for d in deliveries if d["status"] == "failed")
    if "pending" in statuses or not statuses:
        return "pending", None
    if statuses == {"overridden"}:
        return "overridden", None
    return "on_device", None


def file_json(f: dict) -> dict:
    status, error = _status(f["deliveries"])
    counts = {k: 0 for k in ("pending", "on_device", "failed", "overridden")}
    for d in f["deliveries"]:
        counts[d["status"]] += 1
    return jsonable({
        "id": f["id"], "path": f["path"], "mode": f"{f['mode']:04o}", "owner": {"uid": f["uid"], "gid": f["gid"]},
        "size": f["size"], "sha256Prefix": f["sha256"][:16], "updatedAt": f["updated_at"], "status": status,
        "error": error, "deliveries": counts,
        "devices": [{"deviceId": d["device_id"], "status": d["status"], "error": d["error"],
                     "updatedAt": d["updated_at"]} for d in f["deliveries"][:100]]})


def _validate(data: Upload) -> tuple[int, bytes]:
    problem = check_path(data.path)
    if problem:
        raise BadRequest(f"path: {problem}", code="invalid_path")
    if not _MODE.match(data.mode):
        raise BadRequest("mode: must be octal permissions such as 0600", code="invalid_mode")
    mode = int(data.mode, 8)
    problem = check_mode(mode)
    if problem:
        raise BadRequest(f"mode: {problem}", code="invalid_mode")
    try:
        content = base64.b64decode(data.content_base64, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("content_base64: not valid base64", code="invalid_content") from None
    if not content:
        raise BadRequest("content_base64: the file is empty", code="empty_content")
    if len(content) > MAX_FILE_BYTES:
        raise PayloadTooLarge(f"content_base64: {len(content)} bytes decoded; the limit is 64 KB",
                              code="file_too_large")
    return mode, content


async def secret_file_owner(kind: str, raw_id: str, relation: str) -> Owner:
    """The configuration or device (``kind``) holding secret files, once the caller is known to hold
    ``relation`` on it; 404 when it is not in the organisation."""
    s = services()
    if kind == "config":
        found = await s.stores.configs.get(org().org_id, parse_uuid(raw_id, "configId"))
        if found is None:
            raise NotFound("configuration not found")
        await authorize(s, relation, Obj("configuration", found[0]["id"]))
        return Owner("config", found[0]["id"])
    device = await s.stores.devices.get(org().org_id, parse_uuid(raw_id, "deviceId"))
    if device is None:
        raise NotFound("device not found")
    await authorize(s, relation, Obj("device", device["id"], device["fleet_id"]))
    return Owner("device", device["id"])


async def _list(owner: Owner):
    files = await services().stores.secrets.list(org().org_id, owner)
    if files is None:
        raise NotFound("not found")
    return {"data": [file_json(f) for f in files]}


async def _upload(owner: Owner, data: Upload):
    s = services()
    mode, content = _validate(data)
    sha = hashlib.sha256(content).hexdigest()
    now = s.clock.now()
    try:
        row = await s.stores.secrets.upsert(org().org_id, owner, now, path=data.path, mode=mode, uid=data.uid, gid=data.gid,
                                     ciphertext=s.stores.secret_box.seal(content), size=len(content), sha256=sha)
    except OwnerMissing:
        raise NotFound("not found") from None
    except LimitExceeded as exc:
        limit = f"{MAX_FILES} files" if exc.what == "count" else f"{MAX_TOTAL_BYTES // 1024} KB in total"
        raise Conflict(f"secret file limit exceeded: at most {limit} per configuration or device",
                       code="secret_file_limit") from None
    del content
    if owner.kind == "device":
        actor = await s.device_actor(owner.id)
        actor.tell(SyncFiles())  # pushed shortly after save when the device is online
    else:
        # Devices already running the configuration get it now, with the version they run; the others
        # with their next version or at their next hello (actors/device_delivery.py). Whether a device
        # is linked is asked of the live actors, never of the presence row: that row is written behind,
        # and a device whose hello fell inside the gap would have got the file neither way.
        for device_id in await s.stores.secrets.devices_running_config_waiting(row["id"]):
            await tell_linked(s, device_id, ApplyConfig())
    files = await s.stores.secrets.list(org().org_id, owner) or []
    saved = next(f for f in files if f["id"] == row["id"])
    created = row["created_at"] == row["updated_at"]
    return {"data": file_json(saved)}, 201 if created else 200


async def _delete(owner: Owner, file_id: str):
    s = services()
    result = await s.stores.secrets.delete(org().org_id, owner, parse_uuid(file_id, "fileId"), s.clock.now())
    if result is None:
        raise NotFound("secret file not found")
    path, devices = result
    for device_id in devices:
        await tell_linked(s, device_id, RemoveFiles((path,)))
    return {"data": {"id": file_id, "path": path, "deleted": True}}


async def tell_linked(s, device_id, msg) -> None:
    """Tell a device's actor if the device is linked: to this node, or (in a cluster) to another, which
    is told at least once (hub/cluster/tells.py) with no actor started here. A device linked nowhere
    gets the same at its next hello.

    The upload or deletion commits before this looks, and a link registers its actor (and, in a
    cluster, claims the link) before its hello reads the database: so either that hello sees the
    change or this finds the link."""
    actor = s.registry.lookup(("device", device_id))
    if actor is not None:
        actor.tell(msg)  # it passes the tell on if its device is linked elsewhere
    else:
        s.topology.tell_elsewhere(device_id, msg)


class SecretFileOut(BaseModel):
    """Metadata only: the contents are write-only."""
    model_config = ConfigDict(extra="allow")
    id: str
    path: str
    mode: str
    size: int
    # Named for what it holds: the spec asks for "a short SHA-256 fingerprint" and leaves the wire name
    # open; this field was "sha256" while holding 16 of its 64 hex characters (issue 37 item 13).
    sha256Prefix: str = Field(..., description="the spec's short SHA-256 fingerprint: the first 16 hex characters "
                                               "of the SHA-256 of the contents (never the contents)")
    status: str


@bp.get("/configurations/<configId>/secret-files")
@responds(enveloped(SecretFileOut, many=True))
@errors(400, 401, 403, 404)
async def list_config_files(configId: str):
    return await _list(await secret_file_owner("config", configId, "viewer"))


@bp.post("/configurations/<configId>/secret-files")
@body(Upload)
@responds(enveloped(SecretFileOut), 201)
@responds(enveloped(SecretFileOut), 200)
@errors(400, 401, 403, 404, 409, 413)
async def upload_config_file(configId: str, data: Upload):
    return await _upload(await secret_file_owner("config", configId, "editor"), data)


@bp.delete("/configurations/<configId>/secret-files/<fileId>")
@responds(enveloped(DeletedOut))
@errors(400, 401, 403, 404)
async def delete_config_file(configId: str, fileId: str):
    return await _delete(await secret_file_owner("config", configId, "editor"), fileId)


@bp.get("/devices/<deviceId>/secret-files")
@responds(enveloped(SecretFileOut, many=True))
@errors(400, 401, 403, 404)
async def list_device_files(deviceId: str):
    return await _list(await secret_file_owner("device", deviceId, "viewer"))


@bp.post("/devices/<deviceId>/secret-files")
@body(Upload)
@responds(enveloped(SecretFileOut), 201)
@responds(enveloped(SecretFileOut), 200)
@errors(400, 401, 403, 404, 409, 413)
async def upload_device_file(deviceId: str, data: Upload):
    return await _upload(await secret_file_owner("device", deviceId, "editor"), data)


@bp.delete("/devices/<deviceId>/secret-files/<fileId>")
@responds(enveloped(DeletedOut))
@errors(400, 401, 403, 404)
async def delete_device_file(deviceId: str, fileId: str):
    return await _delete(await secret_file_owner("device", deviceId, "editor"), fileId)
