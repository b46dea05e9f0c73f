-- The spec spells the held rollout step QUEUED_MAINTENANCE (States and transitions: Rollout device
-- state under a maintenance window). Rows written before are renamed, so storage, the machine
-- (actors/machines/rollout.Step), events and the API all use the one spelling.

UPDATE rollout_devices SET step = 'QUEUED_MAINTENANCE' WHERE step = 'queued_maintenance';
