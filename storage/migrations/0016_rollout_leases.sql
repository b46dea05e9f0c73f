-- Rollout ownership in a cluster (issue 17, docs/cluster.md): the node holding a rollout's lease runs
-- its RolloutActor; each holder takes the next epoch, and every rollout write checks, in its own
-- transaction, that the lease is still (owner, epoch): a node that lost its lease writes nothing more.
CREATE TABLE rollout_leases (
    rollout_id uuid PRIMARY KEY REFERENCES rollouts(id) ON DELETE CASCADE,
    owner      text NOT NULL,
    epoch      bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
