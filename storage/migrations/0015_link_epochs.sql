-- One connection per device across a cluster (issue 17, docs/cluster.md): each link a node accepts
-- claims the next epoch of its device, and that node's presence writes apply only while the epoch is
-- still the device's current one, so a late disconnect or heartbeat timeout from a node whose link
-- was taken over never marks the device offline. link_node names the holder (for operators).
ALTER TABLE devices
    ADD COLUMN link_epoch bigint NOT NULL DEFAULT 0,
    ADD COLUMN link_node text;
