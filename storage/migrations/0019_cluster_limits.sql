-- Limits that hold across the cluster (issue 17 item 5, docs/cluster.md "Limits"). Only nodes of a
-- cluster use these tables; one hub process keeps its counters in memory as before.

-- API requests per key (an organisation, a principal, an address) in one fixed rate-limit window:
-- each node writes its own count (a SET, so a retried write cannot count twice) every sync round and
-- reads the others' sum.
CREATE TABLE cluster_rate_counts (
    key          text    NOT NULL,
    window_start bigint  NOT NULL,  -- epoch seconds
    node         text    NOT NULL,
    used         integer NOT NULL,
    PRIMARY KEY (window_start, key, node)
);

-- Credential attempts (sign-in failures, token requests) in a sliding window, one row per attempt and
-- key; reserved under a transaction-scoped advisory lock per key, so the count is exact cluster-wide.
CREATE TABLE cluster_attempts (
    key  text        NOT NULL,
    at   timestamptz NOT NULL,
    node text        NOT NULL
);
CREATE INDEX cluster_attempts_key_at ON cluster_attempts (key, at);

-- Open event streams, one row each, so the per-owner cap counts every node's; a dead node's rows go
-- with its cluster_nodes row.
CREATE TABLE cluster_streams (
    stream    uuid PRIMARY KEY,
    owner     text        NOT NULL,
    node      text        NOT NULL,
    opened_at timestamptz NOT NULL
);
CREATE INDEX cluster_streams_owner ON cluster_streams (owner);
CREATE INDEX cluster_streams_node ON cluster_streams (node);
