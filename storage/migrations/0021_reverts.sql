-- What a revert goes back to (issue 37 item 5): the hub kept only what each device runs now.
--
-- devices.previous_version_id: the version the device ran before the one it runs, kept by a trigger
-- so that every writer of applied_version_id (a result from the device, a factory reset) keeps it
-- without knowing of it. Only a change of what runs counts: a rejected version never ran, and the
-- device's applied_version_id stays what it ran, so a rejection leaves the previous version alone.
-- A device that goes back to its previous version (a revert) has none known after it (one step is
-- kept, not a history): a second revert is refused rather than sending the version reverted from.
ALTER TABLE devices ADD COLUMN previous_version_id uuid REFERENCES configuration_versions(id) ON DELETE SET NULL;

CREATE FUNCTION fleethub_device_version_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.previous_version_id := CASE WHEN NEW.applied_version_id = OLD.previous_version_id THEN NULL
                                    ELSE OLD.applied_version_id END;
    RETURN NEW;
END
$$;

CREATE TRIGGER devices_version_changed
    BEFORE UPDATE OF applied_version_id ON devices
    FOR EACH ROW WHEN (OLD.applied_version_id IS NOT NULL
                       AND OLD.applied_version_id IS DISTINCT FROM NEW.applied_version_id)
    EXECUTE FUNCTION fleethub_device_version_changed();

-- rollout_devices.previous_version_id: what each device ran when the rollout was created, so a fleet
-- revert goes back to what the fleet ran before that rollout (devices released by a cancel, or never
-- reached, run it still; the others are taken back).
ALTER TABLE rollout_devices ADD COLUMN previous_version_id uuid
    REFERENCES configuration_versions(id) ON DELETE SET NULL;

-- rollouts.revert_kind: 'fleet' or 'device' for a revert, NULL for every other rollout; revert_of: the
-- rollout a fleet revert undoes. A fleet revert looks past reverts (of the fleet or of one of its
-- devices) to the newest other rollout, so reverting twice sends the same version again (devices
-- that missed the first get it) and never the version reverted from.
ALTER TABLE rollouts ADD COLUMN revert_kind text CHECK (revert_kind IN ('fleet', 'device'));
ALTER TABLE rollouts ADD COLUMN revert_of uuid REFERENCES rollouts(id) ON DELETE SET NULL;
