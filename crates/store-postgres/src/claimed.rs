//! The claim's write for occurrences already chosen and locked, and a claim's answer row.

use campanile_core::{OccurrenceId, ScheduleId};
use campanile_store::upgrade::CLOSE_RUNNING_ATTEMPT_ROW;
use campanile_store::*;
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::db::{R, pg_err, query, ts, u32_of};

/// A statement's instant: the caller's (`param`, an `int8` parameter) or else the database's
/// clock as the statement runs. The liveness gate ([`fence::hands_out_work_sql`]) compares the
/// marks with this, not with an instant the claim read before it waited for a connection, a
/// lock or a stalled database, which could let it commit in an outage not yet judged.
pub(crate) fn statement_now(param: &str) -> String {
    format!("COALESCE({param}::int8, (extract(epoch FROM clock_timestamp()) * 1000)::int8)")
}

/// A claim statement: `pick` defines the CTE `pick(seq, lost_epoch, lost_owner, lost_started,
/// lost_lease, payload)` of the occurrences to claim (locked by it or by the caller) with their
/// versions' payloads, after any CTEs it needs; the `lost_` columns are those of the attempt being taken over, read from the row as
/// locked, when it is still `RUNNING` under an expired lease (else NULL). The rest records
/// those lost attempts and claims the occurrences — new epoch, the claimer as owner, the lease
/// — into the CTE `claimed` (the claimed occurrences with their payloads); an occurrence
/// taken over gets its lost lease's end as its availability (when it became claimable again,
/// [`fence::FenceView::claimable_since`]). The new attempt is
/// not a row of its own: the occurrence row holds it ([`OccurrenceDetail::assemble`]).
/// `owner`, `key`, `now` and `lease_until` are the statement's expressions for those values
/// (over `pick`'s columns, if they like; `key` is the claim's [`ClaimKey`] id or NULL); `tag`,
/// an `int8` expression over `pick`, is carried to `claimed` as its column `tag` (so the final `SELECT` never joins `pick` again: CTEs are
/// estimated at one row, so such a join is a nested loop, quadratic in the batch); `select` is
/// the statement's final `SELECT`. Every PostgreSQL claim goes through this one text.
pub(crate) fn claim_sql(
    pick: &str,
    owner: &str,
    key: &str,
    now: &str,
    lease_until: &str,
    tag: &str,
    select: &str,
) -> String {
    format!(
        "WITH {pick},
         lost AS (
             INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, finished_at, outcome)
             SELECT seq, lost_epoch, lost_owner, lost_started, lost_lease, {now}, 'lease_expired'
               FROM pick WHERE lost_epoch IS NOT NULL
             {CLOSE_RUNNING_ATTEMPT_ROW}),
         upd AS (
             UPDATE occurrences o
                SET state = 'RUNNING', owner = {owner}, epoch = o.epoch + 1, attempts = o.attempts + 1,
                    lease_until = {lease_until}, claimed_at = {now}, cancel_requested = false,
                    ran_until = NULL, claim_key = {key},
                    available_at = CASE WHEN pick.lost_epoch IS NOT NULL
                                        THEN GREATEST(o.available_at, pick.lost_lease)
                                        ELSE o.available_at END
               FROM pick WHERE o.seq = pick.seq
             RETURNING o.seq, o.id, o.schedule_id, o.version, o.scheduled_for, o.available_at, o.epoch, o.attempts,
                       o.lease_until, {tag} AS tag, pick.payload),
         claimed AS (
             SELECT id, schedule_id, version, scheduled_for, available_at, epoch, attempts, payload, seq, tag,
                    lease_until
               FROM upd)
         {select}"
    )
}

/// The final `SELECT` of a claim that returns only the claimed occurrences.
pub(crate) const CLAIMED_ROWS: &str =
    "SELECT id, schedule_id, version, scheduled_for, available_at, epoch, attempts, payload, lease_until
           FROM claimed ORDER BY available_at, seq";

/// The claim of occurrences already chosen and locked by the caller's transaction (so this
/// statement's snapshot sees them as locked). `$1` their seqs, `$2` owner, `$3` now, `$4`
/// lease length in ms (NULL: each occurrence's own), `$5` the claim's key or NULL.
pub(crate) static CLAIM_SEQS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    claim_sql(
        "pick AS (
             SELECT o.seq, CASE WHEN o.state = 'RUNNING' THEN o.epoch END AS lost_epoch,
                    o.owner AS lost_owner, o.claimed_at AS lost_started, o.lease_until AS lost_lease,
                    v.payload
               FROM occurrences o
               LEFT JOIN schedule_versions v ON v.schedule_id = o.schedule_id AND v.version = o.version
              WHERE o.seq = ANY($1::int8[]))",
        "$2",
        "$5::uuid",
        "$3",
        "$3 + COALESCE($4::int8, o.lease_ms)",
        "NULL::int8",
        CLAIMED_ROWS,
    )
});

/// Claims these occurrences (already chosen, and locked by the caller's transaction).
pub(crate) async fn claim_seqs<C: GenericClient>(
    c: &C,
    seqs: &[i64],
    owner: &str,
    key: Option<Uuid>,
    now: i64,
    lease: Option<i64>,
) -> R<Vec<Claimed>> {
    let rows = query(c, &CLAIM_SEQS, &[&seqs, &owner, &now, &lease, &key]).await?;
    rows.iter().map(|r| claimed_row(r, now, 8)).collect()
}

/// A claimed occurrence from a claim's row; its lease end is in column `lease_col`.
pub(crate) fn claimed_row(r: &Row, now: i64, lease_col: usize) -> R<Claimed> {
    let lease_until: i64 = r.try_get(lease_col).map_err(pg_err)?;
    Ok(Claimed {
        id: OccurrenceId(r.get(0)),
        schedule_id: ScheduleId(r.get(1)),
        version: u32_of(r.get(2)),
        scheduled_for: ts(r.get(3))?,
        available_at: ts(r.get(4))?,
        epoch: r.get(5),
        lease_until: ts(lease_until)?,
        attempt: u32_of(r.get(6)),
        claimed_at: ts(now)?,
        payload: r.get(7),
        replayed: false,
    })
}
