SET search_path=exp;
INSERT INTO ready SELECT tenant_id, queue, priority, available_at, seq FROM occurrences;
CHECKPOINT;
