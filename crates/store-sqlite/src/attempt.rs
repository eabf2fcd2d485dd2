//! Ended attempts as rows of their own.

use campanile_store::*;
use rusqlite::{Connection, params};

use crate::db::{R, db_err};

/// An attempt row from occurrence `?5`'s current attempt (owner, epoch, `claimed_at`, lease),
/// ended at `?2` with outcome `?1` and error `?3`/`?4`.
pub(crate) const RECORD_ONE: &str = include_str!("sql/record_one.sql");

/// The same for those of the occurrences `?5` (a JSON array of seqs) still running.
pub(crate) const RECORD_LOST: &str = include_str!("sql/record_lost.sql");

/// Records how the current attempt of occurrence `seq` ended, unless it succeeded: a
/// successful attempt stays on the occurrence row, which is final
/// ([`OccurrenceDetail::assemble`]).
pub(crate) fn record_attempt(
    c: &Connection,
    seq: i64,
    outcome: AttemptOutcome,
    now: i64,
    error_class: Option<&str>,
    error_message: Option<&str>,
) -> R<()> {
    if outcome == AttemptOutcome::Succeeded {
        return Ok(());
    }
    c.prepare_cached(RECORD_ONE)
        .and_then(|mut s| {
            s.execute(params![
                outcome.as_str(),
                now,
                error_class,
                error_message,
                seq
            ])
        })
        .map_err(db_err)?;
    Ok(())
}
