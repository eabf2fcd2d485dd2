-- A tenant's class: the bounded label of its lag metrics (`default` unless an admin sets one).
-- A constant default: PostgreSQL records it in the catalog and rewrites no row.
ALTER TABLE tenants ADD COLUMN class TEXT NOT NULL DEFAULT 'default';
