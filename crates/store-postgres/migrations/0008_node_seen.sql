-- When each node's liveness mark was written (a renewal, or a graceful stop): after an outage
-- of the whole control plane, the latest one is when a node was last seen alive, which bounds
-- what came due while nobody could hand it out. NULL for marks written before this version
-- (they were written one lease before `alive_until`).
ALTER TABLE planner_nodes ADD COLUMN seen_at BIGINT;
