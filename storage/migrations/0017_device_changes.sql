-- Every hub process keeps, for each device it has read, the organisation and fleet that decide access
-- (storage/devices.py, Devices.identities), and never lets that entry expire: a command to a warm
-- device then needs no storage read. This trigger is what keeps it true. Any change of a device's
-- fleet or organisation, and any deletion, by any process or by a cascade (a fleet deleted sets its
-- devices' fleet to NULL; an organisation deleted removes its devices), notifies the device's id on
-- channel fleethub_devices after commit; every process LISTENs and forgets that device.
CREATE FUNCTION fleethub_device_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fleethub_devices', OLD.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER devices_identity_changed
    AFTER UPDATE OF fleet_id, org_id ON devices
    FOR EACH ROW WHEN (OLD.fleet_id IS DISTINCT FROM NEW.fleet_id OR OLD.org_id IS DISTINCT FROM NEW.org_id)
    EXECUTE FUNCTION fleethub_device_changed();

CREATE TRIGGER devices_deleted
    AFTER DELETE ON devices
    FOR EACH ROW EXECUTE FUNCTION fleethub_device_changed();
