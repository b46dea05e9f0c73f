-- Tunnel entitlements per organisation (hub/tunnels/limits.py applies the defaults). An
-- organisation without a row was never entitled: sessions disabled. NULL in a limit column means
-- "the deployment's default" (hub/tunnels/limits.py DEFAULTS), so a default can change later
-- without rewriting rows.
CREATE TABLE tunnel_entitlements (
    org_id                   uuid PRIMARY KEY REFERENCES organizations(id) ON DELETE CASCADE,
    enabled                  boolean NOT NULL DEFAULT false,
    relay_allowed            boolean NOT NULL DEFAULT false,
    max_sessions_per_device  integer CHECK (max_sessions_per_device > 0),
    max_sessions             integer CHECK (max_sessions > 0),
    bandwidth_bps            bigint CHECK (bandwidth_bps > 0),
    max_session_seconds      integer CHECK (max_session_seconds > 0),
    updated_at               timestamptz NOT NULL
);

-- What a session needs beyond 0006's row: the signed grant's payload (a renewal keeps all of it
-- but the validity window) and the cap on the session's total length. Usage columns only ever grow
-- (GREATEST), and what they grew by is what gets metered, so a repeated or late tunnel.usage event
-- adds nothing twice.
ALTER TABLE tunnel_sessions
    ADD COLUMN grant_payload   jsonb,
    ADD COLUMN max_expires_at  timestamptz;
CREATE INDEX tunnel_sessions_org_open ON tunnel_sessions (org_id) WHERE state IN ('opening', 'open');
