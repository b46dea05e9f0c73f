-- A memory test's full per-page error map, uploaded by the device over HTTP when it is more than a
-- result lists (issue 19): PUT /v1/device/memory-tests/{runId}/page-map. Stored as the validated
-- upload, gzip-compressed (at most 1 MiB; hub/api/pagemaps.py), one per (device, run).
CREATE TABLE memtest_page_maps (
    device_id   uuid NOT NULL REFERENCES devices(id) ON DELETE CASCADE,
    run_id      text NOT NULL,
    org_id      uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    at          timestamptz NOT NULL,
    pages       bigint NOT NULL,
    complete    boolean NOT NULL,
    body        bytea NOT NULL,
    PRIMARY KEY (device_id, run_id)
);
