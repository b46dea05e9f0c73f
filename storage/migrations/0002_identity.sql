-- Identity and access: service accounts, relation tuples, dashboard sessions, rate-limit tiers,
-- and the audit fields issue 3 asks for.

ALTER TABLE organizations ADD COLUMN rate_limit integer;  -- requests per hour; the enterprise figure
ALTER TABLE organizations ADD CONSTRAINT organizations_tier_check
    CHECK (tier IN ('standard', 'professional', 'enterprise'));

-- OAuth 2.0 client-credentials identities. The client secret is stored only as SHA-256.
CREATE TABLE service_accounts (
    id           uuid PRIMARY KEY,
    org_id       uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    name         text NOT NULL,
    description  text NOT NULL DEFAULT '',
    client_id    text NOT NULL UNIQUE,
    secret_hash  bytea NOT NULL,
    created_by   uuid REFERENCES users(id) ON DELETE SET NULL,
    created_at   timestamptz NOT NULL,
    UNIQUE (org_id, name)
);

-- Relation tuples (object, relation, subject). object_type 'organization' with the org's own id
-- means "this relation on every object of the organisation" (an org-wide IAM grant).
CREATE TABLE relations (
    org_id        uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    object_type   text NOT NULL CHECK (object_type IN ('organization', 'fleet', 'device', 'configuration')),
    object_id     uuid NOT NULL,
    relation      text NOT NULL,
    subject_type  text NOT NULL CHECK (subject_type IN ('user', 'service')),
    subject_id    uuid NOT NULL,
    created_at    timestamptz NOT NULL,
    PRIMARY KEY (org_id, subject_type, subject_id, object_type, object_id, relation)
);
CREATE INDEX relations_object ON relations (org_id, object_type, object_id);

-- Dashboard sessions: the cookie value is stored only as SHA-256.
CREATE TABLE sessions (
    id_hash      bytea PRIMARY KEY,
    user_id      uuid NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    csrf_token   text NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    client_addr  text
);
CREATE INDEX sessions_user ON sessions (user_id);

ALTER TABLE audit_events ADD COLUMN credential_kind text;
ALTER TABLE audit_events ADD COLUMN query text;
ALTER TABLE audit_events ADD COLUMN client_addr text;
ALTER TABLE audit_events ADD COLUMN duration_ms real;
CREATE INDEX audit_events_org_actor ON audit_events (org_id, actor_user_id, at DESC);
