-- Which cluster nodes are alive (issue 17, docs/cluster.md): each node writes its row every third of
-- FLEETHUB_NODE_LEASE_SECONDS; a row older than that is a node that died (or lost the database) and
-- the first node to notice deletes it and, in the same transaction, marks offline the devices whose
-- link that node held last. Without it, a killed node's devices stayed online until a node with the
-- same id started again.
CREATE TABLE cluster_nodes (
    node    text PRIMARY KEY,
    seen_at timestamptz NOT NULL
);
