-- Tokens held by assistant answers in progress. An answer reserves its estimate before it starts,
-- under a transaction-scoped advisory lock per organisation, so concurrent answers on any hub node see
-- each other's holds and the budget cannot be promised twice. When the answer ends, its reservation is
-- deleted and its actual tokens added to usage_daily in the same transaction. A hub that dies
-- mid-answer leaves its hold until expires_at: the budget errs on the side of refusing, for minutes.
CREATE TABLE assistant_reservations (
    id          uuid PRIMARY KEY,
    org_id      uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    user_key    text NOT NULL,
    day         date NOT NULL,
    tokens      bigint NOT NULL CHECK (tokens >= 0),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX assistant_reservations_org ON assistant_reservations (org_id, expires_at);
