-- Configurations with versions, secret files (encrypted) and their delivery to devices.

ALTER TABLE configurations ADD COLUMN status text NOT NULL DEFAULT 'active'
    CHECK (status IN ('active', 'archived'));
ALTER TABLE configurations ADD COLUMN current_version integer NOT NULL DEFAULT 0;

CREATE TABLE configuration_versions (
    id          uuid PRIMARY KEY,
    config_id   uuid NOT NULL REFERENCES configurations(id) ON DELETE CASCADE,
    org_id      uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    version     integer NOT NULL,
    spec        jsonb NOT NULL,
    created_at  timestamptz NOT NULL,
    created_by  text,
    UNIQUE (config_id, version)
);

-- What each device is told to run, and what it reported running.
ALTER TABLE devices ADD COLUMN config_id uuid REFERENCES configurations(id) ON DELETE SET NULL;
ALTER TABLE devices ADD COLUMN config_version_id uuid REFERENCES configuration_versions(id) ON DELETE SET NULL;
ALTER TABLE devices ADD COLUMN applied_version_id uuid REFERENCES configuration_versions(id) ON DELETE SET NULL;
ALTER TABLE devices ADD COLUMN config_status text;   -- pending | applied | rejected
ALTER TABLE devices ADD COLUMN config_error text;

-- A secret file belongs to exactly one configuration or one device. Contents: SecretBox ciphertext.
CREATE TABLE secret_files (
    id          uuid PRIMARY KEY,
    org_id      uuid NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    config_id   uuid REFERENCES configurations(id) ON DELETE CASCADE,
    device_id   uuid REFERENCES devices(id) ON DELETE CASCADE,
    path        text NOT NULL,
    mode        integer NOT NULL,
    uid         integer NOT NULL,
    gid         integer NOT NULL,
    size        integer NOT NULL,
    sha256      text NOT NULL,
    ciphertext  bytea NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    CHECK ((config_id IS NULL) <> (device_id IS NULL)),
    UNIQUE (config_id, path),
    UNIQUE (device_id, path)
);

-- Delivery status of one file on one device: pending | on_device | failed | overridden.
CREATE TABLE secret_file_deliveries (
    file_id     uuid NOT NULL REFERENCES secret_files(id) ON DELETE CASCADE,
    device_id   uuid NOT NULL REFERENCES devices(id) ON DELETE CASCADE,
    status      text NOT NULL CHECK (status IN ('pending', 'on_device', 'failed', 'overridden')),
    error       text,
    sha256      text NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (file_id, device_id)
);
CREATE INDEX secret_file_deliveries_device ON secret_file_deliveries (device_id);
