//! Checks both backends run before a migration, in the same SQL (it is valid in both
//! dialects): a row returned names what makes the upgrade unsafe, and the migration refuses.

/// From the outbox-relay migration on, queue names starting with `$` are reserved for
/// external targets (`$nats:<subject>`). A database that already routes work through such a
/// queue would, once upgraded, see its workers refused (422) and its new occurrences handed to
/// the relay. Finds one such queue in use: the current version of a schedule that is not
/// canceled, or an occurrence still to run.
pub const RESERVED_QUEUE_IN_USE: &str = "SELECT v.queue FROM schedules s
       JOIN schedule_versions v ON v.schedule_id = s.id AND v.version = s.version
      WHERE s.state <> 'CANCELED' AND substr(v.queue, 1, 1) = '$'
     UNION ALL
     SELECT queue FROM occurrences
      WHERE state IN ('READY', 'RETRY_WAIT', 'RUNNING') AND substr(queue, 1, 1) = '$'
     LIMIT 1";

/// The conflict clause of every write of an ended attempt's row (`ON CONFLICT` on the key
/// `(occurrence_seq, epoch)`), valid in both dialects. Older versions opened a `running` row
/// at claim time; an attempt that ends under this version finds it when a node of the older
/// version wrote it, and closes it in place. Any other row for that attempt stands.
pub const CLOSE_RUNNING_ATTEMPT_ROW: &str = "ON CONFLICT (occurrence_seq, epoch) DO UPDATE
        SET finished_at = excluded.finished_at, outcome = excluded.outcome,
            lease_until = excluded.lease_until, error_class = excluded.error_class,
            error_message = excluded.error_message
      WHERE attempts.outcome = 'running'";

/// The refusal of migration `version` (`name`) because `queue` is in use.
#[must_use]
pub fn reserved_queue_refusal(version: i64, name: &str, queue: &str) -> String {
    format!(
        "migration {version} ({name}) refused: queue '{queue}' is in use, and from this version on \
         queue names starting with '$' are reserved for external targets; with the previous \
         campanile, move the schedules of that queue to another queue and let its pending \
         occurrences finish, then upgrade"
    )
}
