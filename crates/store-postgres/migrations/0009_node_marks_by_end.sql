-- Every claim reads the latest liveness mark's end (no work is handed out while every mark has
-- lapsed), and a node's acquisition drops marks that lapsed a day before: both by this index,
-- not by a scan of one row per node start.
CREATE INDEX planner_nodes_alive ON planner_nodes (alive_until);
