-- Fleet update (maintenance) windows: the schedule as the API writes it (enabled, timezone,
-- start_time, end_time, days_of_week — actors/machines/window.py UpdateWindow.to_json()).
-- NULL means the fleet has no window: rollouts may update its devices at any time.
ALTER TABLE fleets ADD COLUMN update_window jsonb
    CONSTRAINT fleets_update_window_object CHECK (update_window IS NULL OR jsonb_typeof(update_window) = 'object');
