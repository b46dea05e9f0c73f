-- The event log's rows keep no foreign key to organizations. PostgreSQL checks a foreign key row by
-- row (a trigger and a key-share lock of the organisation's row for every event): 2.7 of the 11.5 ms
-- of an append of 500 events (EXPLAIN ANALYZE), a quarter of PostgreSQL's work per event, at the
-- thousand events a second of a fleet under load. The organisation is still checked once per append:
-- the same statement moves its event_counters row on, whose own foreign key refers to organizations,
-- and an event is inserted only joined to that row (storage/events.py). Organisations are never
-- deleted; one that were would have its events deleted with its counters by the code deleting it.
ALTER TABLE events DROP CONSTRAINT events_org_id_fkey;
