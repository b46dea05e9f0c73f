-- Metering batches already added to usage_daily, by the id hub/metering.py gave each batch. The id is
-- written in the batch's own transaction, so a batch whose outcome the hub did not learn (cancelled at
-- its COMMIT, say) and sends again adds nothing the second time. Rows older than a day are deleted by
-- the writes themselves: a batch is sent again within seconds or not at all.
CREATE TABLE usage_flushes (
    id  uuid PRIMARY KEY,
    at  timestamptz NOT NULL
);
CREATE INDEX usage_flushes_at ON usage_flushes (at);
