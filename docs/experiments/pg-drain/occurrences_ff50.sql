ALTER TABLE occurrences SET (fillfactor = 50);
