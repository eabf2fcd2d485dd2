-- A tenant's class: the bounded label of its lag metrics (`default` unless an admin sets one).
ALTER TABLE tenants ADD COLUMN class TEXT NOT NULL DEFAULT 'default';
