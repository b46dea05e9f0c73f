-- Organisations, people, credentials, fleets and devices: the foundation every other table hangs on.

CREATE TABLE organizations (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    tier        text NOT NULL DEFAULT 'standard',
    created_at  timestamptz NOT NULL
);

CREATE TABLE users (
    id             uuid PRIMARY KEY,
    email          text NOT NULL UNIQUE,
    name           text NOT NULL DEFAULT '',
    password_hash  text,
    is_staff       boolean NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL
);

-- role: admin (the whole API of the organisation) or member (only permitted fleets).
CREATE TABLE memberships (
    org_id      uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    user_id     uuid NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    role        text NOT NULL CHECK (role IN ('admin', 'member')),
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (org_id, user_id)
);

-- Personal API tokens: the secret is stored only as its SHA-256; the token dies with its user.
CREATE TABLE pats (
    id           text PRIMARY KEY,
    user_id      uuid NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    description  text NOT NULL DEFAULT '',
    secret_hash  bytea NOT NULL UNIQUE,
    expires_at   timestamptz,
    last_used_at timestamptz,
    created_at   timestamptz NOT NULL
);

CREATE TABLE fleets (
    id              uuid PRIMARY KEY,
    org_id          uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    name            text NOT NULL,
    description     text NOT NULL DEFAULT '',
    tags            text[] NOT NULL DEFAULT '{}',
    architecture    text,
    config_id       uuid,
    registry_proxy  boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    UNIQUE (org_id, name)
);

CREATE TABLE devices (
    id                 uuid PRIMARY KEY,
    org_id             uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    fleet_id           uuid REFERENCES fleets(id) ON DELETE SET NULL,
    name               text NOT NULL,
    tags               text[] NOT NULL DEFAULT '{}',
    token_hash         bytea NOT NULL UNIQUE,
    firmware           text,
    architecture       text,
    online             boolean NOT NULL DEFAULT false,
    state              text NOT NULL DEFAULT 'offline',
    boot_reason        text,
    last_seen_at       timestamptz,
    connected_at       timestamptz,
    tunnel_public_key  text,
    facts              jsonb NOT NULL DEFAULT '{}',
    conditions         jsonb NOT NULL DEFAULT '[]',
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL
);
CREATE INDEX devices_org_fleet ON devices (org_id, fleet_id);
CREATE INDEX devices_org_created ON devices (org_id, created_at, id);

-- Every API call, written behind the response. The full audit query API is its own issue.
CREATE TABLE audit_events (
    id           uuid PRIMARY KEY,
    org_id       uuid REFERENCES organizations(id) ON DELETE CASCADE,
    at           timestamptz NOT NULL,
    actor_type   text NOT NULL,
    actor_id     text,
    actor_user_id uuid,
    method       text NOT NULL,
    path         text NOT NULL,
    status       integer NOT NULL,
    request_id   text NOT NULL,
    action       text,
    target       text,
    details      jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_events_org_at ON audit_events (org_id, at DESC);

-- Configurations are filled out by their own migration; fleets and create requests reference them now.
CREATE TABLE configurations (
    id          uuid PRIMARY KEY,
    org_id      uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    name        text NOT NULL,
    description text NOT NULL DEFAULT '',
    tags        text[] NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    UNIQUE (org_id, name)
);
ALTER TABLE fleets ADD CONSTRAINT fleets_config_fk FOREIGN KEY (config_id) REFERENCES configurations(id) ON DELETE SET NULL;
