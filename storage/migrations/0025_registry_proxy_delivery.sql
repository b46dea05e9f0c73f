-- A registry login created, rotated or deleted, or the fleet's registry proxy changed, after a device
-- got its version (issue 36): the device's auth file or proxy mode is out of date until the hub sends
-- it those of the version it runs. Set for the devices running a container version concerned; cleared
-- when the hub reads them to send them. An offline device gets them at its next hello by this flag.
ALTER TABLE devices ADD COLUMN pull_settings_stale boolean NOT NULL DEFAULT false;

-- How a fleet with the registry proxy on uses it (issue 36): 'fallback', devices pull from the registry
-- and through the hub when that fails; 'always', through the hub only. Sent with each container version.
ALTER TABLE fleets ADD COLUMN registry_proxy_mode text NOT NULL DEFAULT 'fallback'
    CHECK (registry_proxy_mode IN ('fallback', 'always'));
