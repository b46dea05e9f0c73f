-- Metering and the tables several features share (billing reads them; tunnels and the assistant
-- write them). Quantities are summed per organisation, UTC day, product and key; the key says what
-- a quantity is about (a fleet id for registry-proxy bytes, a user id for assistant tokens, '' for
-- organisation-wide counts). Devices active per day are counted from their own rows, so a device
-- seen a thousand times a day is still one device.

CREATE TABLE usage_daily (
    org_id    uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    day       date NOT NULL,
    product   text NOT NULL,
    key       text NOT NULL DEFAULT '',
    quantity  numeric NOT NULL DEFAULT 0,
    PRIMARY KEY (org_id, product, day, key)
);
CREATE INDEX usage_daily_org_day ON usage_daily (org_id, day);

CREATE TABLE device_active_days (
    org_id     uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    day        date NOT NULL,
    device_id  uuid NOT NULL,
    PRIMARY KEY (org_id, day, device_id)
);

-- An organisation's billing profile; without one, pricing and usage answer 404 and feature
-- changes 409 (spec). anchor_day: the billing period starts on this day of the month (1 = calendar
-- month). locked: billing-locked account (what a lock blocks is documented in docs/billing.md).
CREATE TABLE billing_profiles (
    org_id      uuid PRIMARY KEY REFERENCES organizations(id) ON DELETE CASCADE,
    plan        text NOT NULL,
    enterprise  boolean NOT NULL DEFAULT false,
    anchor_day  integer NOT NULL DEFAULT 1 CHECK (anchor_day BETWEEN 1 AND 28),
    locked      boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- One row per tunnel session: written when it opens, updated by the device's tunnel.usage events
-- and when it closes. Billing reads duration and bytes from here.
CREATE TABLE tunnel_sessions (
    id                uuid PRIMARY KEY,
    org_id            uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    device_id         uuid NOT NULL REFERENCES devices(id) ON DELETE CASCADE,
    principal_kind    text NOT NULL,
    principal_id      uuid NOT NULL,
    target            text NOT NULL,
    relay_allowed     boolean NOT NULL,
    state             text NOT NULL,          -- opening, open, closed, failed
    opened_at         timestamptz NOT NULL,
    expires_at        timestamptz NOT NULL,
    closed_at         timestamptz,
    close_reason      text,
    duration_seconds  numeric NOT NULL DEFAULT 0,
    bytes_in          bigint NOT NULL DEFAULT 0,
    bytes_out         bigint NOT NULL DEFAULT 0,
    relayed_bytes     bigint NOT NULL DEFAULT 0,
    updated_at        timestamptz NOT NULL
);
CREATE INDEX tunnel_sessions_org_opened ON tunnel_sessions (org_id, opened_at, id);
CREATE INDEX tunnel_sessions_device_open ON tunnel_sessions (device_id) WHERE state IN ('opening', 'open');
