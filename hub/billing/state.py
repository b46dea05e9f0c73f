"""An organisation's billing state as the request path needs it: profile, feature entitlements and
lock, cached like authentication lookups (tag ``billing:<org>``) so gating a request costs no
storage crossing. Every change calls ``changed`` before it answers, which forgets the entry here
and in every other process on the database (Services.invalidate)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from hub.billing import features
from hub.errors import Conflict, Forbidden


@dataclass(frozen=True)
class OrgBilling:
    profile: dict | None
    latest: dict[str, bool] = field(default_factory=dict)

    @property
    def enterprise(self) -> bool:
        return bool(self.profile and self.profile["enterprise"])

    @property
    def locked(self) -> bool:
        return bool(self.profile and self.profile["locked"])

    def enabled(self, feature: str) -> bool:
        return features.current(feature, self.latest, self.enterprise)

    def view(self) -> dict[str, dict]:
        return features.view(self.latest, self.enterprise)


def tag(org_id: uuid.UUID) -> str:
    return f"billing:{org_id}"


async def org_billing(s, org_id: uuid.UUID) -> OrgBilling:
    # One load per organisation at a time (AuthCache.get_or_load): thousands of devices linking at once
    # after a restart all ask for their organisation's telemetry setting, and must not each cross into
    # storage. A change announced while it loads is not kept.
    async def load() -> OrgBilling:
        return OrgBilling(await s.stores.billing.profile(org_id), await s.stores.billing.latest_features(org_id))

    return await s.access.auth_cache.get_or_load(("billing", org_id), load, lambda _: (tag(org_id),))


async def changed(s, org_id: uuid.UUID) -> None:
    await s.invalidate(tag(org_id))


async def require_feature(s, org_id: uuid.UUID, feature: str) -> None:
    if not (await org_billing(s, org_id)).enabled(feature):
        raise Forbidden(f"the {feature} feature is not enabled for this organisation",
                        code="feature_disabled")


async def ensure_not_locked(s, org_id: uuid.UUID) -> None:
    """What a billing lock blocks calls this (docs/billing.md): 409 billing_locked. The spec's statuses
    for PUT /billing/features are 200, 400, 403 and 409 (no billing profile); a lock is the same kind of
    refusal, the organisation's billing state, so it is a 409 too, not a 402 the spec does not list."""
    if (await org_billing(s, org_id)).locked:
        raise Conflict("the account is billing-locked; settle the account to change this", code="billing_locked")
