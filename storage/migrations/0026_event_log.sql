-- The event log and webhooks (issue 33). Every event the SSE streams carry is appended here; the
-- per-organisation sequence (org_seq) is the cursor clients resume from (SSE Last-Event-ID,
-- GET /v1/events?after=) and seq is the global one. event_counters holds each organisation's last
-- org_seq: an append updates its row first, so appends of one organisation commit one after another
-- in sequence order and a reader that saw org_seq N has seen every event before it. pruned_through
-- is the last org_seq retention removed, for the 410 that names the oldest cursor still held.
CREATE TABLE event_counters (
    org_id          uuid PRIMARY KEY REFERENCES organizations(id) ON DELETE CASCADE,
    last            bigint NOT NULL DEFAULT 0,
    pruned_through  bigint NOT NULL DEFAULT 0
);

CREATE TABLE events (
    seq         bigserial PRIMARY KEY,
    org_id      uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    org_seq     bigint NOT NULL,
    id          uuid NOT NULL,
    type        text NOT NULL,
    subject     text NOT NULL,
    time        timestamptz NOT NULL,
    device_id   uuid,
    rollout_id  uuid,
    fleet_ids   uuid[] NOT NULL DEFAULT '{}',
    data        jsonb NOT NULL,
    UNIQUE (org_id, org_seq)
);
CREATE INDEX events_subject ON events (org_id, subject, org_seq);
CREATE INDEX events_time ON events (time);

-- Webhook endpoints of an organisation. The signing secret is sealed like secret files' contents
-- (storage/crypto.py). cursor: the last org_seq handled (delivered, or not matching); attempts and
-- next_attempt_at: the retry state of the event after it. A delivery worker holds the lease
-- (lease_owner, lease_epoch) and every write of its progress checks that epoch, as rollouts do.
CREATE TABLE webhook_endpoints (
    id               uuid PRIMARY KEY,
    org_id           uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    url              text NOT NULL,
    ciphertext       bytea NOT NULL,
    event_types      text[] NOT NULL,
    fleet_ids        uuid[],
    enabled          boolean NOT NULL DEFAULT true,
    disabled_reason  text,
    cursor           bigint NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    failing_since    timestamptz,
    next_attempt_at  timestamptz,
    lease_owner      text,
    lease_epoch      bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL
);
CREATE INDEX webhook_endpoints_org ON webhook_endpoints (org_id);

CREATE TABLE webhook_deliveries (
    id           bigserial PRIMARY KEY,
    endpoint_id  uuid NOT NULL REFERENCES webhook_endpoints(id) ON DELETE CASCADE,
    org_seq      bigint,
    event_id     uuid NOT NULL,
    type         text NOT NULL,
    attempt      integer NOT NULL,
    status       integer,
    ok           boolean NOT NULL,
    latency_ms   double precision NOT NULL,
    excerpt      text NOT NULL DEFAULT '',
    error        text,
    manual       boolean NOT NULL DEFAULT false,
    at           timestamptz NOT NULL
);
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, id DESC);
