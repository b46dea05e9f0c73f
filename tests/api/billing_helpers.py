"""Shared by the billing tests: ``fleethub admin`` billing commands run for real against the test's
database, and a service account's Bearer token."""

from __future__ import annotations

from tests.hubtools import Hub, notifications_heard


async def admin(hub: Hub, tmp_path, *argv: str) -> dict:
    """Run ``fleethub admin ARGV`` as the CLI does (its own services on the hub's database); returns
    once the running hub has heard the change's invalidation, as an operator's next command would
    after the notification's delivery (milliseconds; longer on a loaded machine)."""
    from hub.admin import run_admin
    from hub.cli import build_parser
    from hub.settings import Settings

    args = build_parser().parse_args(["admin", *argv])
    settings = Settings(data_dir=tmp_path / "admin-cli", database_url=hub.services.settings.database_url)
    out = await run_admin(settings, args)
    await notifications_heard(hub)
    return out


async def bearer(hub: Hub, relation: str = "billing_viewer") -> dict:
    """Headers with a service account's access token holding ``relation`` on the organisation."""
    r = await hub.call("POST", "/v1/service-accounts",
                       json={"name": f"sa-{relation}", "policies": [{"relation": relation, "object_type": "organization"}]})
    assert r.status_code == 201, r.text
    sa = r.json()["data"]
    r = await hub.client.post(hub.base_url + "/v1/oauth/token", data={
        "grant_type": "client_credentials", "client_id": sa["client_id"], "client_secret": sa["client_secret"]})
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['access_token']}", "X-Organization-ID": hub.org_id}
