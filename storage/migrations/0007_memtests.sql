-- Memory tests. A device's results, one row per run (stored once: the device re-sends a result
-- at every link until the hub acknowledges it). ``at`` orders them newest first: when the hub
-- received the result, in the hub's clock (device clocks are not trusted for ordering).
CREATE TABLE memtest_results (
    device_id    uuid NOT NULL REFERENCES devices(id) ON DELETE CASCADE,
    run_id       text NOT NULL,
    org_id       uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    outcome      text NOT NULL,
    verdict      text,
    at           timestamptz NOT NULL,
    result       jsonb NOT NULL,
    PRIMARY KEY (device_id, run_id)
);
CREATE INDEX memtest_results_newest ON memtest_results (device_id, at DESC, run_id);

-- What a stored read (device offline or silent) shows: the current or last run's status as the
-- hub last knew it, the device's last health snapshot and when it was reported, and the memory the
-- device found bad (retired pages from its list, distinct bad pages from its results) for the
-- MemoryFault condition.
CREATE TABLE memtest_devices (
    device_id           uuid PRIMARY KEY REFERENCES devices(id) ON DELETE CASCADE,
    org_id              uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    status              jsonb,
    status_at           timestamptz,
    health              jsonb,
    health_reported_at  timestamptz,
    retired_pages       bigint[] NOT NULL DEFAULT '{}',
    bad_pages           bigint[] NOT NULL DEFAULT '{}',
    verdict             text
);
