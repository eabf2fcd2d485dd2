//! `campanile reconcile`: offline, for one tenant and a time range, recompute from every
//! schedule version and its calendar the occurrences that should exist, and classify each as
//! succeeded, failed, canceled, missed, skipped, pending, archived, not planned yet — or missing
//! (a bug).
//! Exit status 3 when anything is missing or unexpected, or a schedule could not be checked
//! over the whole range.

use std::collections::BTreeMap;

use campanile_core::ScheduleId;
use campanile_planner::reconcile::{Class, Finding, Range, Reconciliation, Shortfall, reconcile};
use campanile_store::{ScheduleList, Store, TenantByName, TenantId};
use clap::Args;
use jiff::{SignedDuration, Timestamp};
use serde_json::json;

use crate::db;
use crate::error::CliError;

/// Arguments of `campanile reconcile`.
#[derive(Debug, Args)]
pub(crate) struct ReconcileArgs {
    /// The tenant whose schedules to reconcile.
    #[arg(long)]
    tenant: String,
    /// Only this schedule (its id).
    #[arg(long)]
    schedule: Option<uuid::Uuid>,
    /// Start of the range, RFC 3339 (e.g. 2026-11-29T00:00:00Z) [default: 24 hours before --to].
    #[arg(long, value_parser = campanile_calendar::parse_instant)]
    from: Option<Timestamp>,
    /// End of the range (exclusive), RFC 3339 [default: now, by the database's clock].
    #[arg(long, value_parser = campanile_calendar::parse_instant)]
    to: Option<Timestamp>,
    /// At most this many expected instants per schedule; a schedule with more is reconciled
    /// up to where the limit is reached, and the report says so.
    #[arg(long, default_value_t = 1_000_000)]
    max_instants: usize,
    /// An active schedule's instant still unplanned this many seconds after it came due is
    /// reported as stalled (planning of that schedule is stuck), not as lag.
    #[arg(long, default_value_t = 3_600)]
    stall_after: u32,
    /// SQLite file path, or a postgres:// URL.
    #[arg(long, env = "CAMPANILE_DATABASE", default_value = "./campanile.db")]
    database: String,
    /// Print one JSON object (the whole report) as the last line.
    #[arg(long)]
    json: bool,
}

/// Findings listed in a report, per kind (the counts are always complete).
const LISTED: usize = 1_000;

pub(crate) fn run(args: ReconcileArgs) -> Result<(), CliError> {
    if args.max_instants == 0 {
        return Err(CliError::usage("--max-instants must be positive"));
    }
    // A mistyped path must not create (and reconcile) a new, empty database.
    if !db::is_postgres(&args.database) && !std::path::Path::new(&args.database).exists() {
        return Err(CliError::usage(format!(
            "no database at {}: give the path of an existing SQLite file or a postgres:// URL",
            db::redact(&args.database)
        )));
    }
    crate::error::block_on(async move {
        let store = db::open(&args.database, None).await?;
        let store_err = |e: campanile_store::StoreError| CliError::runtime(format!("{e}"));
        let tenant = store
            .tenant_by_name(TenantByName {
                name: args.tenant.clone(),
            })
            .await
            .map_err(store_err)?
            .ok_or_else(|| CliError::usage(format!("no tenant named '{}'", args.tenant)))?;
        let now = store.store_now().await.map_err(store_err)?;
        let to = args.to.unwrap_or(now);
        let from = match args.from {
            Some(f) => f,
            None => to
                .checked_sub(SignedDuration::from_hours(24))
                .map_err(|e| CliError::usage(format!("--to: {e}")))?,
        };
        if from >= to {
            return Err(CliError::usage(format!(
                "--from ({from}) must be before --to ({to})"
            )));
        }
        let range = Range {
            from,
            to,
            now,
            max_instants: args.max_instants,
            stall_after: SignedDuration::from_secs(i64::from(args.stall_after)),
        };
        let ids = match args.schedule {
            Some(id) => vec![ScheduleId(id)],
            None => schedule_ids(store.as_ref(), tenant.id).await?,
        };
        let mut results = Vec::with_capacity(ids.len());
        let mut unreadable = Vec::new();
        for id in ids {
            use campanile_planner::PlannerError;
            match reconcile(store.as_ref(), tenant.id, id, &range).await {
                Ok(r) => results.push(r),
                Err(PlannerError::Store(campanile_store::StoreError::NotFound(_))) => {
                    return Err(CliError::usage(format!(
                        "tenant '{}' has no schedule {}",
                        args.tenant, id.0
                    )));
                }
                Err(PlannerError::Store(e)) => {
                    return Err(CliError::runtime(format!(
                        "reconciling schedule {}: {e}",
                        id.0
                    )));
                }
                // A stored definition that no longer builds (a time zone the system lost):
                // that schedule cannot be checked; the others are.
                Err(e) => unreadable.push((id, e.to_string())),
            }
        }
        let report = Report::new(&results, unreadable);
        report.print(&args.tenant, &range);
        if args.json {
            println!("{}", report.json(&args.tenant, &range));
        }
        if report.clean() {
            Ok(())
        } else {
            Err(CliError::findings(format!(
                "reconciliation found {} missing, {} stalled and {} unexpected occurrences; {} \
                 schedules not fully checked (truncated or unreadable)",
                report.missing.len(),
                report.stalled.len(),
                report.unexpected.len(),
                report.truncated.len() + report.unreadable.len()
            )))
        }
    })
}

/// Every schedule of the tenant, whatever its state.
async fn schedule_ids(store: &dyn Store, tenant: TenantId) -> Result<Vec<ScheduleId>, CliError> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .schedule_list(ScheduleList {
                tenant,
                state: None,
                queue: None,
                timezone: None,
                after,
                limit: 500,
            })
            .await
            .map_err(|e| CliError::runtime(format!("listing schedules: {e}")))?;
        out.extend(page.iter().map(|s| s.id));
        match page.last() {
            Some(last) if page.len() == 500 => after = Some(last.id),
            _ => return Ok(out),
        }
    }
}

/// The tenant's totals and findings.
struct Report<'a> {
    schedules: usize,
    counts: BTreeMap<Class, u64>,
    missing: Vec<(ScheduleId, &'a Finding)>,
    stalled: Vec<(ScheduleId, &'a Finding)>,
    unexpected: Vec<(ScheduleId, &'a Finding)>,
    truncated: Vec<&'a Reconciliation>,
    shortfall: Vec<(ScheduleId, &'a Shortfall)>,
    backfilled: u64,
    unreadable: Vec<(ScheduleId, String)>,
}

impl<'a> Report<'a> {
    /// Nothing missing or unexpected, and every schedule checked over the whole range.
    fn clean(&self) -> bool {
        self.missing.is_empty()
            && self.stalled.is_empty()
            && self.unexpected.is_empty()
            && self.truncated.is_empty()
            && self.shortfall.is_empty()
            && self.unreadable.is_empty()
    }

    fn new(results: &'a [Reconciliation], unreadable: Vec<(ScheduleId, String)>) -> Report<'a> {
        let mut counts = BTreeMap::new();
        for r in results {
            for (class, n) in &r.counts {
                *counts.entry(*class).or_insert(0) += n;
            }
        }
        Report {
            schedules: results.len(),
            counts,
            missing: results
                .iter()
                .flat_map(|r| r.missing.iter().map(move |f| (r.schedule_id, f)))
                .collect(),
            stalled: results
                .iter()
                .flat_map(|r| r.stalled.iter().map(move |f| (r.schedule_id, f)))
                .collect(),
            unexpected: results
                .iter()
                .flat_map(|r| r.unexpected.iter().map(move |f| (r.schedule_id, f)))
                .collect(),
            truncated: results.iter().filter(|r| r.truncated).collect(),
            shortfall: results
                .iter()
                .flat_map(|r| r.archive_shortfall.iter().map(move |f| (r.schedule_id, f)))
                .collect(),
            backfilled: results.iter().map(|r| r.backfilled).sum(),
            unreadable,
        }
    }

    fn print(&self, tenant: &str, range: &Range) {
        println!(
            "campanile reconcile — tenant '{tenant}', {} to {} (now {})",
            range.from, range.to, range.now
        );
        let expected: u64 = self.counts.values().sum();
        println!("{} schedules, {expected} expected instants", self.schedules);
        let line: Vec<String> = Class::ALL
            .iter()
            .map(|c| format!("{} {}", c.as_str(), self.counts.get(c).unwrap_or(&0)))
            .collect();
        println!("{}", line.join("  "));
        println!(
            "unexpected {}  backfilled {}",
            self.unexpected.len(),
            self.backfilled
        );
        for (id, f) in self.missing.iter().take(LISTED) {
            println!(
                "MISSING     schedule {} version {} at {}",
                id.0, f.version, f.scheduled_for
            );
        }
        for (id, f) in self.stalled.iter().take(LISTED) {
            println!(
                "STALLED     schedule {} version {} at {} (still unplanned)",
                id.0, f.version, f.scheduled_for
            );
        }
        for (id, f) in self.unexpected.iter().take(LISTED) {
            println!(
                "UNEXPECTED  schedule {} version {} at {} ({})",
                id.0,
                f.version,
                f.scheduled_for,
                f.state.map_or("?", |s| s.as_str())
            );
        }
        for r in &self.truncated {
            println!(
                "TRUNCATED   schedule {}: reconciled up to {} (--max-instants)",
                r.schedule_id.0, r.covered_to
            );
        }
        for (id, f) in self.shortfall.iter().take(LISTED) {
            println!(
                "SHORTFALL   schedule {} day {}: {} instants have no row, retention archived {}",
                id.0, f.day, f.instants, f.archived
            );
        }
        for (id, e) in &self.unreadable {
            println!("UNREADABLE  schedule {}: {e}", id.0);
        }
    }

    fn json(&self, tenant: &str, range: &Range) -> serde_json::Value {
        let finding = |(id, f): &(ScheduleId, &Finding)| {
            json!({
                "schedule_id": id.0,
                "version": f.version,
                "scheduled_for": f.scheduled_for.to_string(),
                "state": f.state.map(|s| s.as_str()),
            })
        };
        let counts: serde_json::Map<String, serde_json::Value> = Class::ALL
            .iter()
            .map(|c| {
                (
                    c.as_str().to_string(),
                    json!(self.counts.get(c).unwrap_or(&0)),
                )
            })
            .collect();
        json!({
            "tenant": tenant,
            "from": range.from.to_string(),
            "to": range.to.to_string(),
            "now": range.now.to_string(),
            "schedules": self.schedules,
            "counts": counts,
            "missing_total": self.missing.len(),
            "stalled_total": self.stalled.len(),
            "stalled": self.stalled.iter().take(LISTED).map(finding).collect::<Vec<_>>(),
            "unexpected_total": self.unexpected.len(),
            "backfilled": self.backfilled,
            "missing": self.missing.iter().take(LISTED).map(finding).collect::<Vec<_>>(),
            "unexpected": self.unexpected.iter().take(LISTED).map(finding).collect::<Vec<_>>(),
            "truncated": self.truncated.iter().map(|r| json!({
                "schedule_id": r.schedule_id.0,
                "covered_to": r.covered_to.to_string(),
            })).collect::<Vec<_>>(),
            "archive_shortfall": self.shortfall.iter().map(|(id, f)| json!({
                "schedule_id": id.0,
                "day": f.day.to_string(),
                "instants": f.instants,
                "archived": f.archived,
            })).collect::<Vec<_>>(),
            "unreadable": self.unreadable.iter().map(|(id, e)| json!({
                "schedule_id": id.0,
                "error": e,
            })).collect::<Vec<_>>(),
        })
    }
}
