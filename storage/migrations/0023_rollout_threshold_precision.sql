-- Rollout thresholds were REAL (float4): 0.1 came back as 0.10000000149011612 in every answer. Double
-- precision holds what the caller sent. Through numeric, a stored float4 becomes its shortest decimal
-- (0.1), so rows written before this read back as they were sent too.
ALTER TABLE rollouts
    ALTER COLUMN success_threshold TYPE double precision USING success_threshold::numeric::double precision,
    ALTER COLUMN failure_threshold TYPE double precision USING failure_threshold::numeric::double precision;
