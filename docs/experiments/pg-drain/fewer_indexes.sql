ALTER TABLE attempts SET (fillfactor = 50);
DROP INDEX occurrences_schedule;
DROP INDEX occurrences_running;
