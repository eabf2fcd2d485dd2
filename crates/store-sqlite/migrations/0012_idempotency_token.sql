-- An Idempotency-Key reservation names the request holding it (`token`) and, once that
-- request's create commits, the schedule it created (`schedule_id`, written in the create's
-- own transaction). A reservation whose request died before answering used to hold the key
-- for good (every retry answered 409 request_in_progress); now a retry of the same request
-- takes over a reservation that has no schedule after a while, and answers from the schedule
-- when it has one. Reservations made before this migration have neither: they are taken over
-- once old enough, like any other.
ALTER TABLE idempotency_keys ADD COLUMN token TEXT;
ALTER TABLE idempotency_keys ADD COLUMN schedule_id BLOB;
