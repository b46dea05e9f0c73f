-- Registry credentials of an organisation (issue 36 item 3): the hub uses them to pin a version's
-- images and delivers them to the devices that run a version from that registry. The password is
-- stored as the secret files' contents are, sealed with the hub's secret key (storage/crypto.py), and
-- re-sealed with them at a key rotation. One credential per registry and organisation.
CREATE TABLE registry_credentials (
    id          uuid PRIMARY KEY,
    org_id      uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    registry    text NOT NULL,
    username    text NOT NULL,
    ciphertext  bytea NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    UNIQUE (org_id, registry)
);
