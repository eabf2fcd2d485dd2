//! Reconciliation: a day and a half of planning — a DST change, an outage, an update, a pause
//! and resume, a cancel, a one-off, a pause ended by a cancel or an update — reconciles with
//! nothing missing or unexpected; an update behind a lagging planner records what it
//! supersedes.

use std::collections::BTreeMap;

use campanile_calendar::{DstFold, DstPolicy};
use campanile_core::{ErrorClass, Misfire, Overlap, ScheduleId};
use campanile_planner::PlannerError;
use campanile_planner::reconcile::{Class, Range, Reconciliation, reconcile};
use campanile_store::*;
use jiff::{SignedDuration, Timestamp};

use crate::both;
use crate::harness::*;

fn utc(expr: &str) -> ScheduleSpec {
    cron(expr, "UTC", DstPolicy::default())
}

async fn run(env: &Env, id: ScheduleId, from: Timestamp, to: Timestamp) -> Reconciliation {
    let range = Range {
        from,
        to,
        now: to,
        max_instants: 100_000,
        stall_after: SignedDuration::from_hours(1),
    };
    reconcile(env.store.as_ref(), env.tenant, id, &range)
        .await
        .unwrap()
}

fn count(r: &Reconciliation, class: Class) -> u64 {
    r.counts.get(&class).copied().unwrap_or(0)
}

/// Reports each claimed occurrence as `outcome` decides, as `worker`.
async fn finish_all(
    env: &Env,
    worker: &str,
    claimed: &[Claimed],
    now: Timestamp,
    outcome: impl Fn(&Claimed) -> Finish,
) {
    if claimed.is_empty() {
        return;
    }
    let items = claimed
        .iter()
        .map(|c| FinishItem {
            lease: c.lease(),
            finish: outcome(c),
        })
        .collect();
    env.store
        .occurrence_finish_many(OccurrenceFinishMany {
            tenant: env.tenant,
            worker_id: worker.into(),
            items,
            now: Some(now),
        })
        .await
        .unwrap();
}

/// Claims what is due and finishes it: an occurrence for an instant whose minute is a
/// multiple of 7 fails permanently (a dead letter), the rest succeed — decided by the
/// instant, not by claim order.
async fn work(env: &Env, now: Timestamp) {
    let claimed = env
        .store
        .occurrence_claim(OccurrenceClaim {
            max_bytes: None,
            tenant: env.tenant,
            queue: "jobs".into(),
            worker_id: "w".into(),
            max: 100,
            lease: Some(SignedDuration::from_secs(600)),
            key: None,
            now: Some(now),
        })
        .await
        .unwrap();
    finish_all(env, "w", &claimed, now, |c| {
        if c.scheduled_for.as_second().div_euclid(60) % 7 == 0 {
            Finish::Failed {
                class: ErrorClass::Permanent,
                message: "no".into(),
            }
        } else {
            Finish::Succeeded { result: None }
        }
    })
    .await;
}

/// Reconciles each named schedule over `[from, to)` and checks it is clean: nothing missing,
/// unexpected or stalled, the whole range covered.
async fn reconcile_clean<'a>(
    env: &Env,
    named: &[(&'a str, ScheduleId)],
    from: Timestamp,
    to: Timestamp,
) -> BTreeMap<&'a str, Reconciliation> {
    let mut results = BTreeMap::new();
    for &(name, id) in named {
        let r = run(env, id, from, to).await;
        assert!(r.missing.is_empty(), "{name}: missing {:?}", r.missing);
        assert!(
            r.unexpected.is_empty(),
            "{name}: unexpected {:?}",
            r.unexpected
        );
        assert!(r.stalled.is_empty(), "{name}: stalled {:?}", r.stalled);
        assert!(!r.truncated, "{name}");
        results.insert(name, r);
    }
    results
}

async fn a_planned_history_reconciles_with_nothing_missing(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "n");
    // Paris springs forward on 2026-03-29 at 01:00 UTC (02:00 local does not exist).
    let t0 = ts("2026-03-28T12:00:00Z");
    let create = async |spec: ScheduleSpec| {
        s.create(env.tenant, spec, Some(t0))
            .await
            .unwrap()
            .record
            .id
    };
    let paris = create(cron("*/30 * * * *", "Europe/Paris", DstPolicy::default())).await;
    let mut minutely = utc("* * * * *");
    minutely.misfire = Misfire::FireOnce {
        max_lateness: SignedDuration::from_secs(90),
    };
    let fire_once = create(minutely).await;
    let updated = create(utc("0 * * * *")).await;
    let paused = create(utc("*/10 * * * *")).await;
    let canceled = create(utc("*/15 * * * *")).await;
    let pause_cancel = create(utc("*/15 * * * *")).await;
    let pause_update = create(utc("*/15 * * * *")).await;
    let one_off = create(spec(Timing::At(plus(t0, 5 * 3600)))).await;

    let end = plus(t0, 36 * 3600);
    let (down, up) = (plus(t0, 20 * 3600), plus(t0, 23 * 3600));
    let mut now = t0;
    while now < end {
        let h = now.duration_since(t0).as_secs();
        if h == 6 * 3600 {
            s.update(env.tenant, updated, 1, utc("*/20 * * * *"), Some(now))
                .await
                .unwrap();
        }
        if h == 8 * 3600 {
            for id in [paused, pause_cancel, pause_update] {
                s.transition(env.tenant, id, ScheduleState::Paused, Some(now))
                    .await
                    .unwrap();
            }
        }
        if h == 10 * 3600 {
            s.transition(env.tenant, paused, ScheduleState::Active, Some(now))
                .await
                .unwrap();
        }
        if h == 12 * 3600 {
            for id in [canceled, pause_cancel] {
                s.transition(env.tenant, id, ScheduleState::Canceled, Some(now))
                    .await
                    .unwrap();
            }
            // Version 2 is the pause's.
            s.update(env.tenant, pause_update, 2, utc("0 * * * *"), Some(now))
                .await
                .unwrap();
        }
        // Three hours with nothing planned nor claimed: what came due is judged late.
        if now < down || now >= up {
            p.tick(Some(now)).await.unwrap();
            work(&env, now).await;
        }
        now = plus(now, 300);
    }
    p.tick(Some(end)).await.unwrap();

    let results = reconcile_clean(
        &env,
        &[
            ("paris", paris),
            ("fire_once", fire_once),
            ("updated", updated),
            ("paused", paused),
            ("canceled", canceled),
            ("pause_cancel", pause_cancel),
            ("pause_update", pause_update),
            ("one_off", one_off),
        ],
        t0,
        end,
    )
    .await;
    let total = |name: &str| results[name].counts.values().sum::<u64>();
    // Every instant of each definition in force, once: 36 h of half hours (the local hour
    // Paris skips is no gap in UTC: 01:30 local is 00:30Z, 03:00 local 01:00Z); 6 h hourly
    // then 30 h every 20 minutes; 12 h every quarter hour; one.
    assert_eq!(total("paris"), 72);
    assert_eq!(total("updated"), 6 + 30 * 3);
    assert_eq!(total("canceled"), 12 * 4);
    // Paused from 8 h to the cancel or update at 12 h: what came due while paused was never
    // planned, and the change recorded it as canceled (the pause retired what was planned
    // ahead, also canceled).
    assert_eq!(total("pause_cancel"), 12 * 4);
    assert!(count(&results["pause_cancel"], Class::Canceled) >= 4 * 4);
    assert_eq!(total("pause_update"), 12 * 4 + 24);
    assert!(count(&results["pause_update"], Class::Canceled) >= 4 * 4);
    // Still paused after its update: the new definition's instants wait for a resume.
    assert_eq!(count(&results["pause_update"], Class::NotPlannedYet), 24);
    assert_eq!(total("paused"), 36 * 6);
    assert_eq!(total("fire_once"), 36 * 60);
    // The one-off ran (whether it is one of the claims made to fail depends on claim order).
    let once = &results["one_off"];
    assert_eq!(
        count(once, Class::Succeeded) + count(once, Class::Failed),
        1
    );
    // The outage: under FIRE_ONCE what was planned before it ran late, of the rest the latest
    // ran and the others are on record as missed.
    let fo = &results["fire_once"];
    assert!(count(fo, Class::Missed) >= 150, "{:?}", fo.counts);
    assert!(count(fo, Class::Failed) > 0, "{:?}", fo.counts);
    // The canceled schedule's planned-ahead instants are no longer expected; the hourly
    // schedule's retired ones are not counted under the new definition either.
    assert_eq!(count(&results["canceled"], Class::NotPlannedYet), 0);
    // Every class adds up; nothing is left unclassified in the past.
    for (name, r) in results.iter().filter(|(n, _)| **n != "pause_update") {
        assert_eq!(count(r, Class::Missing), 0, "{name}");
        assert_eq!(count(r, Class::NotPlannedYet), 0, "{name}: {:?}", r.counts);
    }
}

both!(a_planned_history_reconciles_with_nothing_missing);

/// An update made while the planner lagged behind (nothing planned for 40 minutes, the node
/// still live) records the old definition's instants that came due and were never planned as
/// canceled, as it does with the planned ones it retires: nothing missing. (Before, they were
/// dropped unrecorded; reconciliation found it.)
async fn an_update_behind_a_lagging_planner_records_what_it_supersedes(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "n");
    let t0 = ts("2026-06-01T00:00:00Z");
    let id = s
        .create(env.tenant, utc("* * * * *"), Some(t0))
        .await
        .unwrap()
        .record
        .id;
    p.tick(Some(t0)).await.unwrap(); // plans the next 15 minutes
    let planned = instants(&env, id).await;
    let at = plus(t0, 40 * 60);
    let (_, change) = s
        .update(env.tenant, id, 1, utc("*/5 * * * *"), Some(at))
        .await
        .unwrap();
    p.tick(Some(at)).await.unwrap();
    let r = run(&env, id, t0, plus(t0, 45 * 60)).await;
    assert!(r.missing.is_empty(), "{:?}", r.missing);
    assert!(r.unexpected.is_empty());
    // Every minute before the update: planned and retired, or never planned; all canceled.
    assert_eq!(count(&r, Class::Canceled), 40, "{:?}", r.counts);
    assert_eq!(change.canceled, 40);
    assert!(planned.len() < 40);
    // The new definition's first instant is pending.
    assert_eq!(count(&r, Class::Pending), 1);
    // Both versions, oldest first; none of them for another tenant.
    let versions = env
        .store
        .schedule_versions(ScheduleGet {
            tenant: env.tenant,
            id,
        })
        .await
        .unwrap();
    let numbers: Vec<u32> = versions.iter().map(|v| v.version).collect();
    assert_eq!(numbers, [1, 2]);
    assert_eq!(versions[1].created_at, at);
    let other = env
        .store
        .tenant_create(TenantCreate {
            name: "other".into(),
            now: None,
        })
        .await
        .unwrap()
        .id;
    let theirs = env
        .store
        .schedule_versions(ScheduleGet { tenant: other, id })
        .await
        .unwrap();
    assert!(theirs.is_empty());
    let range = Range {
        from: t0,
        to: at,
        now: at,
        max_instants: 10,
        stall_after: SignedDuration::from_hours(1),
    };
    let err = reconcile(env.store.as_ref(), other, id, &range)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
    // A limit cuts the range short and says where.
    let short = reconcile(
        env.store.as_ref(),
        env.tenant,
        id,
        &Range {
            max_instants: 10,
            ..range
        },
    )
    .await
    .unwrap();
    assert!(short.truncated);
    assert_eq!(short.covered_to, plus(t0, 600));
    assert_eq!(short.counts.values().sum::<u64>(), 10);
}

both!(an_update_behind_a_lagging_planner_records_what_it_supersedes);

/// A per-second schedule paused for four hours, then canceled: the first 10,000 instants the
/// cancel supersedes are canceled occurrences, the rest one summarized record marked as
/// superseded; reconciliation finds nothing missing and counts all of them canceled.
async fn a_long_pause_ended_by_a_cancel_is_summarized(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "n");
    let t0 = ts("2026-06-01T00:00:00Z");
    let id = s
        .create(env.tenant, utc("* * * * * *"), Some(t0))
        .await
        .unwrap()
        .record
        .id;
    p.tick(Some(t0)).await.unwrap();
    let paused_at = plus(t0, 60);
    s.transition(env.tenant, id, ScheduleState::Paused, Some(paused_at))
        .await
        .unwrap();
    let at = plus(t0, 4 * 3600);
    let (_, change) = s
        .transition(env.tenant, id, ScheduleState::Canceled, Some(at))
        .await
        .unwrap();
    let r = run(&env, id, t0, at).await;
    assert!(
        r.missing.is_empty(),
        "{:?}",
        &r.missing[..r.missing.len().min(5)]
    );
    assert_eq!(r.counts.values().sum::<u64>(), 4 * 3600, "{:?}", r.counts);
    let gaps = env
        .store
        .missed_range_list(MissedRangeList {
            tenant: env.tenant,
            schedule_id: id,
        })
        .await
        .unwrap();
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert_eq!(gaps[0].last_at, plus(at, -1));
    assert!(gaps[0].count_exact);
    assert!(gaps[0].superseded, "{gaps:?}");
    // 10,000 superseded rows; the pause had retired what was planned ahead of it. The rest,
    // summarized, are canceled too, not missed: the cancel superseded them.
    assert_eq!(change.canceled, 10_000);
    assert_eq!(count(&r, Class::Missed), 0, "{:?}", r.counts);
    assert_eq!(count(&r, Class::Canceled), 4 * 3600, "{:?}", r.counts);
}

both!(a_long_pause_ended_by_a_cancel_is_summarized);

/// An active schedule whose planning stopped (nothing planned for three hours, the node
/// still live) has its instants older than `stall_after` reported as stalled; a paused one's
/// unplanned instants are not.
async fn planning_that_stopped_is_reported_stalled(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "n");
    let t0 = ts("2026-06-01T00:00:00Z");
    let active = s
        .create(env.tenant, utc("*/10 * * * *"), Some(t0))
        .await
        .unwrap()
        .record
        .id;
    let paused = s
        .create(env.tenant, utc("*/10 * * * *"), Some(t0))
        .await
        .unwrap()
        .record
        .id;
    p.tick(Some(t0)).await.unwrap(); // 00:00, 00:10
    s.transition(
        env.tenant,
        paused,
        ScheduleState::Paused,
        Some(plus(t0, 60)),
    )
    .await
    .unwrap();
    let now = plus(t0, 3 * 3600);
    let r = run(&env, active, t0, now).await;
    let stalled: Vec<Timestamp> = r.stalled.iter().map(|f| f.scheduled_for).collect();
    // 00:20 … 01:50 are more than an hour old and unplanned; 02:00 … 02:50 are lag.
    let expect: Vec<Timestamp> = (2..12).map(|k| plus(t0, 600 * k)).collect();
    assert_eq!(stalled, expect);
    assert_eq!(count(&r, Class::NotPlannedYet), 6);
    assert!(r.has_problems());
    let q = run(&env, paused, t0, now).await;
    assert!(q.stalled.is_empty(), "{:?}", q.counts);
    assert!(!q.has_problems());
}

both!(planning_that_stopped_is_reported_stalled);

/// Claims what is due in `queue` at `now` and holds it; the held runs are finished first on
/// even steps only, so an overlap-constrained schedule finds its previous run still running
/// every other step.
async fn hold_and_claim(
    env: &Env,
    queue: &str,
    now: Timestamp,
    step: u64,
    held: &mut Vec<Claimed>,
) {
    if step.is_multiple_of(2) {
        finish_all(env, "slow", held, now, |_| Finish::Succeeded {
            result: None,
        })
        .await;
        held.clear();
    }
    let claimed = env
        .store
        .occurrence_claim(OccurrenceClaim {
            max_bytes: None,
            tenant: env.tenant,
            queue: queue.into(),
            worker_id: "slow".into(),
            max: 10,
            lease: Some(SignedDuration::from_secs(900)),
            key: None,
            now: Some(now),
        })
        .await
        .unwrap();
    held.extend(claimed);
}

/// The calendar features reconciliation has to expand the way the planner does: a fall-back
/// fold run twice or once, a flexible window (claimable later than its instant), a fixed
/// interval from an anchor, CATCHUP after an outage, and SKIP_IF_RUNNING — over 36 hours
/// with a three-hour outage: nothing missing, nothing unexpected, exact totals.
async fn calendar_features_reconcile_with_nothing_missing(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "n");
    // Paris falls back on 2026-10-25 at 01:00 UTC (03:00 CEST becomes 02:00 CET): 02:30
    // local happens at 00:30Z and again at 01:30Z.
    let t0 = ts("2026-10-24T12:00:00Z");
    let create = async |spec: ScheduleSpec| {
        s.create(env.tenant, spec, Some(t0))
            .await
            .unwrap()
            .record
            .id
    };
    let twice = create(cron(
        "30 * * * *",
        "Europe/Paris",
        DstPolicy {
            fold: DstFold::Twice,
            ..DstPolicy::default()
        },
    ))
    .await;
    let once = create(cron(
        "30 * * * *",
        "Europe/Paris",
        DstPolicy {
            fold: DstFold::Once,
            ..DstPolicy::default()
        },
    ))
    .await;
    let mut flex = utc("*/15 * * * *");
    flex.flex_window = SignedDuration::from_mins(10);
    let flex = create(flex).await;
    let every = create(spec(Timing::Every {
        period: SignedDuration::from_secs(420),
        anchor: plus(t0, 180),
    }))
    .await;
    let mut catchup = utc("* * * * *");
    catchup.misfire = Misfire::Catchup {
        max_lateness: SignedDuration::from_secs(90),
        max: 3,
        interval: SignedDuration::from_secs(60),
    };
    let catchup = create(catchup).await;
    let mut overlap = utc("*/5 * * * *");
    overlap.queue = "slow".into();
    overlap.overlap = Overlap::SkipIfRunning;
    let overlap = create(overlap).await;

    let end = plus(t0, 36 * 3600);
    let (down, up) = (plus(t0, 20 * 3600), plus(t0, 23 * 3600));
    let mut held = Vec::new();
    let mut now = t0;
    let mut step = 0;
    while now < end {
        if now < down || now >= up {
            p.tick(Some(now)).await.unwrap();
            work(&env, now).await;
            hold_and_claim(&env, "slow", now, step, &mut held).await;
        }
        now = plus(now, 300);
        step += 1;
    }
    p.tick(Some(end)).await.unwrap();

    let results = reconcile_clean(
        &env,
        &[
            ("twice", twice),
            ("once", once),
            ("flex", flex),
            ("every", every),
            ("catchup", catchup),
            ("overlap", overlap),
        ],
        t0,
        end,
    )
    .await;
    for (name, r) in &results {
        assert_eq!(count(r, Class::NotPlannedYet), 0, "{name}: {:?}", r.counts);
    }
    let total = |name: &str| results[name].counts.values().sum::<u64>();
    // One instant per UTC hour at :30 (Paris is a whole-hour offset), the fold's second
    // 02:30 included; once, the second is not an instant at all.
    assert_eq!(total("twice"), 36);
    assert_eq!(total("once"), 35);
    assert_eq!(total("flex"), 36 * 4);
    // t0 + 3 min, then every 7 minutes until the end: (36 h − 3 min) / 7 min, plus the first.
    assert_eq!(total("every"), (36 * 3600 - 180) / 420 + 1);
    assert_eq!(total("catchup"), 36 * 60);
    assert_eq!(total("overlap"), 36 * 12);
    // The outage (180 instants): those planned ahead of it ran late; of the rest CATCHUP ran
    // at most its three latest, and the others are missed.
    let cu = &results["catchup"];
    let missed = count(cu, Class::Missed);
    assert!((150..=177).contains(&missed), "{:?}", cu.counts);
    // Every other run found the previous one still running.
    let ov = &results["overlap"];
    assert!(count(ov, Class::Skipped) > 100, "{:?}", ov.counts);
    assert!(count(ov, Class::Succeeded) > 100, "{:?}", ov.counts);
}

both!(calendar_features_reconcile_with_nothing_missing);

/// A run an operator triggered is no instant of the calendar: reconcile neither expects it
/// nor reports it as unexpected, and the planned instants around it reconcile as before.
async fn a_triggered_run_is_neither_expected_nor_unexpected(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "n");
    let t0 = ts("2026-06-01T00:00:00Z");
    let id = s
        .create(env.tenant, utc("*/10 * * * *"), Some(t0))
        .await
        .unwrap()
        .record
        .id;
    p.tick(Some(t0)).await.unwrap();
    let manual = env
        .store
        .schedule_trigger(ScheduleTrigger {
            tenant: env.tenant,
            id,
            key: None,
            payload: None,
            now: Some(plus(t0, 123)),
        })
        .await
        .unwrap();
    assert!(manual.created);
    for minute in 0..=30 {
        work(&env, plus(t0, minute * 60 + 1)).await;
    }
    let r = reconcile_clean(&env, &[("cron", id)], t0, plus(t0, 30 * 60)).await;
    let total: u64 = r["cron"].counts.values().sum();
    assert_eq!(
        total, 3,
        "00:00, 00:10 and 00:20 only: {:?}",
        r["cron"].counts
    );
    let d = env
        .store
        .occurrence_get(OccurrenceGet {
            tenant: env.tenant,
            key: OccurrenceKey::Id(manual.occurrence_id),
            now: Some(plus(t0, 30 * 60)),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.occurrence.origin, Origin::Manual);
    assert!(
        d.occurrence.state.is_final(),
        "the triggered run ran: {:?}",
        d.occurrence.state
    );
}

both!(a_triggered_run_is_neither_expected_nor_unexpected);

/// A schedule whose planner was down for an hour (its misfire policy skips what is late), then
/// backfilled over part of the outage and over a range before it existed: each backfilled
/// instant accounts for itself by its state, nothing is missing or unexpected, and the
/// backfilled runs are counted.
async fn backfilled_runs_account_for_their_instants(env: Env) {
    let s = schedules(&env);
    let p = planner(&env, "n");
    let t0 = ts("2026-06-01T00:00:00Z");
    let mut def = utc("*/5 * * * *");
    def.misfire = Misfire::Skip {
        max_lateness: SignedDuration::from_secs(60),
    };
    let id = s.create(env.tenant, def, Some(t0)).await.unwrap().record.id;
    let back = plus(t0, 3600);
    p.tick(Some(back)).await.unwrap();
    let before = run(&env, id, t0, back).await;
    assert_eq!(
        count(&before, Class::Missed),
        12,
        "00:00 … 00:55 were skipped"
    );
    // Run 00:10 … 00:25 after the fact, and a range before the schedule existed.
    let done = s
        .backfill(
            env.tenant,
            id,
            plus(t0, 600),
            plus(t0, 1800),
            None,
            None,
            Some(back),
        )
        .await
        .unwrap();
    // The skipped instants were recorded MISSED (they never ran): they run now, under
    // their own ids.
    assert_eq!(
        (done.instants, done.created.len(), done.rerun.len()),
        (4, 0, 4)
    );
    assert!(
        done.rerun
            .iter()
            .all(|o| o.origin == Origin::Backfill
                && o.state == campanile_core::OccurrenceState::Ready)
    );
    let early = s
        .backfill(env.tenant, id, plus(t0, -1800), t0, None, None, Some(back))
        .await
        .unwrap();
    assert_eq!(early.created.len(), 6);
    for k in 0..4 {
        work(&env, plus(back, k)).await;
    }
    let r = reconcile_clean(&env, &[("cron", id)], plus(t0, -3600), back).await;
    let r = &r["cron"];
    assert_eq!(r.backfilled, 10);
    assert_eq!(
        count(r, Class::Missed),
        8,
        "the skipped instants not backfilled"
    );
    assert_eq!(
        count(r, Class::Succeeded) + count(r, Class::Failed),
        4,
        "the backfilled instants of the schedule's life ran"
    );
    // A range past the bound is refused, and so is one reaching into the future.
    let wide = s
        .backfill(
            env.tenant,
            id,
            plus(t0, -86_400 * 30),
            t0,
            None,
            None,
            Some(back),
        )
        .await;
    assert!(
        matches!(wide, Err(PlannerError::Store(StoreError::Invalid(_)))),
        "{wide:?}"
    );
    let future = s
        .backfill(env.tenant, id, t0, plus(back, 60), None, None, Some(back))
        .await;
    assert!(
        matches!(future, Err(PlannerError::Store(StoreError::Invalid(_)))),
        "{future:?}"
    );
}

both!(backfilled_runs_account_for_their_instants);
