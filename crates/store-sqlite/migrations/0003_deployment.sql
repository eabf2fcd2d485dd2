-- Settings every node of a deployment must agree on, recorded by the first node to start.
-- The planner's shard count decides which shard a schedule is filed under; a node with a
-- different count would silently never plan the schedules on the shards it does not know.
CREATE TABLE deployment (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    shards      INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);
