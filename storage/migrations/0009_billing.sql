-- Billing: prices with effective dates, and the history of feature entitlements.
-- The catalogue of products itself (names, units, how a quantity is priced) is code
-- (hub/billing/catalogue.py); only prices and feature states change at run time.

-- A price row applies from effective_from (a UTC day) until the next row for the same product and
-- scope. org_id NULL: the list price; a row with an org_id overrides the list price for that
-- organisation from its effective day on. Amounts are in the currency's major unit (e.g. 0.25)
-- per the product's billing unit (catalogue.py).
CREATE TABLE billing_prices (
    id              uuid PRIMARY KEY,
    product         text NOT NULL,
    org_id          uuid REFERENCES organizations(id) ON DELETE CASCADE,
    effective_from  date NOT NULL,
    unit_price      numeric NOT NULL CHECK (unit_price >= 0),
    created_at      timestamptz NOT NULL
);
-- One price per product, scope and day: setting it again the same day replaces it.
CREATE UNIQUE INDEX billing_prices_scope_day
    ON billing_prices (product, COALESCE(org_id, '00000000-0000-0000-0000-000000000000'::uuid), effective_from);

-- Feature entitlement changes, append-only: the newest row per (org, feature) is the current state,
-- the history prices the paid features per day. source: 'self_serve' (PUT /v1/billing/features) or
-- 'operator' (fleethub admin feature).
CREATE TABLE billing_feature_states (
    id          bigserial PRIMARY KEY,
    org_id      uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    feature     text NOT NULL,
    enabled     boolean NOT NULL,
    source      text NOT NULL,
    changed_at  timestamptz NOT NULL
);
CREATE INDEX billing_feature_states_org ON billing_feature_states (org_id, feature, changed_at, id);
