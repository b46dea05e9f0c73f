-- Rollouts: a configuration version to the devices of one or more fleets, in batches; one row per
-- device step, so a restarted hub continues where it was.

CREATE TABLE rollouts (
    id                 uuid PRIMARY KEY,
    org_id             uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    fleet_ids          uuid[] NOT NULL,
    config_id          uuid NOT NULL REFERENCES configurations(id) ON DELETE CASCADE,
    version_id         uuid NOT NULL REFERENCES configuration_versions(id) ON DELETE CASCADE,
    force              boolean NOT NULL,
    batch_size         integer,
    success_threshold  real NOT NULL,
    failure_threshold  real NOT NULL,
    state              text NOT NULL,
    reason             text,
    current_batch      integer NOT NULL DEFAULT 0,
    accepted_failures  integer NOT NULL DEFAULT 0,
    accepted_batch     integer NOT NULL DEFAULT -1,
    created_by         text,
    created_by_user    uuid,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL
);
CREATE INDEX rollouts_org_created ON rollouts (org_id, created_at DESC);
CREATE INDEX rollouts_active ON rollouts (state) WHERE state IN ('pending', 'running', 'paused');

CREATE TABLE rollout_devices (
    rollout_id  uuid NOT NULL REFERENCES rollouts(id) ON DELETE CASCADE,
    device_id   uuid NOT NULL REFERENCES devices(id) ON DELETE CASCADE,
    fleet_id    uuid NOT NULL,
    batch       integer NOT NULL,
    step        text NOT NULL,
    error       text,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (rollout_id, device_id)
);
