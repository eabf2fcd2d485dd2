ALTER TABLE attempts SET (fillfactor = 50);
