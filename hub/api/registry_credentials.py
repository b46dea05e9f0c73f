"""Registry credentials of an organisation (issue 36 item 3): write-only, as secret files' contents are.

``POST /v1/registry-credentials`` {registry, username, password} stores the password sealed with the
hub's secret key (the same SecretBox as secret files); every answer, list, audit entry and error
carries the registry, the username and times, never the password. One credential per registry: a
second POST for the registry replaces it (a password rotation). A change reaches the devices running a
version from that registry at once when linked, at their next hello otherwise (``pull_settings_stale``,
migration 0025), and a deleted login leaves their auth files.

Where they are used: the hub pins a version's images with the credential of each image's registry
(hub/images.py), and the device delivery hands a device, in config.apply, the credentials of the
registries its version pulls from and of those only (actors/device_delivery.py). Delivering a
version is reading its registries' passwords on a device one controls, as it is reading its secret
files: managing them takes editor on the organisation (docs/containers.md, "Private registries").
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, g

from actors.device import SendPullSettings
from actors.device_delivery import registries_of
from device_client.shared import imageref
from hub.api.common import errors, jsonable, org, parse_uuid, services
from hub.api.secret_files import tell_linked
from hub.api.validation import DeletedOut, body, enveloped, responds
from hub.auth.authz import require_org
from hub.errors import BadRequest, NotFound

MAX_USERNAME = 256
MAX_PASSWORD = 4096  # registry tokens are long; config.apply carries every credential of a version (16 at most)

bp = Blueprint("registry_credentials", __name__, url_prefix="/v1")


class CredentialIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    registry: str = Field(..., description="host[:port] as image references name it, e.g. registry.example.com "
                                           "or docker.io")
    username: str = Field(..., min_length=1, max_length=MAX_USERNAME)
    password: str = Field(..., min_length=1, max_length=MAX_PASSWORD, description="write-only: never returned",
                          json_schema_extra={"writeOnly": True})


class CredentialOut(BaseModel):
    """Metadata only: the password is write-only."""
    model_config = ConfigDict(extra="allow")
    id: str
    registry: str
    username: str
    createdAt: str
    updatedAt: str


def _json(row: dict) -> dict:
    return jsonable({"id": row["id"], "registry": row["registry"], "username": row["username"],
                     "createdAt": row["created_at"], "updatedAt": row["updated_at"]})


def check_registry(registry: str) -> str:
    if imageref.parse_registry(registry) is None:
        raise BadRequest("registry: a registry host, with an optional port, as an image reference names it "
                         "(registry.example.com, registry.example.com:5000, docker.io)", code="invalid_registry")
    return registry


def _printable(value: str, field: str) -> None:
    # It goes into an HTTP header (ASCII) and a device's auth file; ':' in a username would split basic
    # auth. ASCII also bounds config.apply: 16 logins at these limits (tests/device_client/test_frame_bounds.py).
    if not (value.isascii() and value.isprintable()) or (field == "username" and ":" in value):
        raise BadRequest(f"{field}: printable ASCII characters only" + (", no ':'" if field == "username" else ""),
                         code="invalid_credential")


@bp.post("/registry-credentials")
@body(CredentialIn)
@responds(enveloped(CredentialOut), 201)
@responds(enveloped(CredentialOut), 200)
@errors(400, 401, 403)
async def put_credential(data: CredentialIn):
    """Store the organisation's login for a registry (201), or replace the registry's login (200).
    The answer is metadata: the password is write-only. Needs editor on the organisation."""
    s = services()
    await require_org(s, "editor")
    registry = check_registry(data.registry)
    _printable(data.username, "username")
    _printable(data.password, "password")
    row, created = await s.stores.registry_credentials.put(org().org_id, registry, data.username,
                                                    s.stores.secret_box.seal(data.password.encode()), s.clock.now())
    g.audit_details = {"registry": registry, "username": data.username, "replaced": not created}
    await send_pull_settings(s, org().org_id, registry=registry)
    return {"data": _json(row)}, 201 if created else 200


@bp.get("/registry-credentials")
@responds(enveloped(CredentialOut, many=True))
@errors(401, 403)
async def list_credentials():
    """The organisation's registry logins: registry, username and times, never the password."""
    s = services()
    await require_org(s, "viewer")
    return {"data": [_json(r) for r in await s.stores.registry_credentials.list(org().org_id)]}


@bp.delete("/registry-credentials/<credentialId>")
@responds(enveloped(DeletedOut))
@errors(400, 401, 403, 404)
async def delete_credential(credentialId: str):
    """Forget a registry login: versions are pinned and delivered without it from now on, and the
    devices running a version from that registry drop it. Needs editor on the organisation."""
    s = services()
    await require_org(s, "editor")
    row = await s.stores.registry_credentials.delete(org().org_id, parse_uuid(credentialId, "credentialId"))
    if row is None:
        raise NotFound("no such registry credential in this organisation")
    g.audit_details = {"registry": row["registry"], "username": row["username"]}
    await send_pull_settings(s, org().org_id, registry=row["registry"])
    return {"data": {"id": str(row["id"]), "registry": row["registry"], "deleted": True}}


async def send_pull_settings(s, org_id, *, registry: str | None = None, fleet_id=None, device_id=None) -> None:
    """The devices running a container version that pulls from ``registry`` (any, when None), of
    ``fleet_id`` (or the one ``device_id``) when given, get their logins and proxy mode now: linked ones
    told here, as for a configuration's secret file; the others at their next hello, by the flag."""
    versions = [vid for vid, spec in await s.stores.registry_credentials.running_versions(org_id)
                if registry is None or registry in registries_of(spec)]
    for device_id in await s.stores.devices.mark_pull_settings_stale(org_id, versions, fleet_id, device_id):
        await tell_linked(s, device_id, SendPullSettings())


async def opened_for(org_id, registries) -> dict[str, tuple[str, str]]:
    """registry -> (username, password) for those of ``registries`` the organisation has a credential
    for; opened here, for the one use the caller makes of them."""
    s = services()
    sealed = await s.stores.registry_credentials.sealed_for(org_id, set(registries))
    return {r: (user, s.stores.secret_box.open(c).decode()) for r, (user, c) in sealed.items()}
