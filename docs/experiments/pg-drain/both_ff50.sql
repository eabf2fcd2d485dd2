ALTER TABLE attempts SET (fillfactor = 50);
ALTER TABLE occurrences SET (fillfactor = 50);
