-- The assistant's per-organisation monthly token budget (docs/assistant.md). Without a row the
-- deployment's defaults apply (FLEETHUB_ASSISTANT_MONTHLY_TOKENS, soft limit at 80 %). Token counts
-- themselves live in usage_daily (0006_metering.sql) under the assistant_* products, keyed by user.
-- The staff flag the cost view needs is users.is_staff (0001_foundation.sql).

CREATE TABLE assistant_budgets (
    org_id          uuid PRIMARY KEY REFERENCES organizations(id) ON DELETE CASCADE,
    monthly_tokens  bigint NOT NULL CHECK (monthly_tokens >= 0),
    soft_percent    integer NOT NULL DEFAULT 80 CHECK (soft_percent BETWEEN 1 AND 100),
    updated_at      timestamptz NOT NULL
);
