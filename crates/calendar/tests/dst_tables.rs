//! Reviewed snapshot tables of what the engine does around every DST transition of a year,
//! for zones chosen for their oddities.

use std::fmt::Write as _;

use campanile_calendar::{Calendar, DstFold, DstGap, DstPolicy, FireNote, Zone};
use jiff::{SignedDuration, Timestamp};

fn ts(s: &str) -> Timestamp {
    s.parse().expect("valid instant")
}

fn fmt_fire(zone: &Zone, at: Timestamp, note: Option<FireNote>) -> String {
    let local = at
        .to_zoned_datetime(zone.tz().clone())
        .strftime("%Y-%m-%d %H:%M %:z %Z")
        .to_string();
    let note = match note {
        None => String::new(),
        Some(FireNote::AfterSkippedGap { wall }) => {
            format!("after gap, skipped {}", wall.strftime("%H:%M"))
        }
        Some(FireNote::ShiftedFromGap { wall }) => {
            format!("shifted from {}", wall.strftime("%H:%M"))
        }
        Some(FireNote::FoldEarlier) => "fold, earlier".to_string(),
        Some(FireNote::FoldLater) => "fold, later".to_string(),
        Some(other) => format!("{other:?}"),
    };
    format!("{}  {local:<30} {note}", at.strftime("%Y-%m-%dT%H:%MZ"))
        .trim_end()
        .to_string()
}

fn fires(cal: &Calendar, zone: &Zone, from: Timestamp, to: Timestamp, out: &mut String) {
    let mut cursor = from;
    while let Some(f) = cal.next_fire(cursor) {
        if f.at >= to {
            break;
        }
        let _ = writeln!(out, "    {}", fmt_fire(zone, f.at, f.note));
        cursor = f.at;
    }
}

/// Every transition of `zone` in `[from, to)`, and for each: a half-hourly expression over
/// the six hours around it, and a daily expression at a wall time inside the gap or fold
/// over the three days around it, under the default and the alternative policy.
fn table(zone_name: &str, from: &str, to: &str) -> String {
    let zone = Zone::get(zone_name).expect("zone");
    let tz = zone.tz();
    let mut out = String::new();
    let _ = writeln!(out, "zone {zone_name}, transitions in [{from}, {to})");
    let mut any = false;
    for tr in tz.following(ts(from)) {
        let t = tr.timestamp();
        if t >= ts(to) {
            break;
        }
        let before = tz.to_offset(t.checked_sub(SignedDuration::from_secs(1)).expect("ts"));
        let after = tr.offset();
        if before == after {
            continue;
        }
        any = true;
        let kind = if after > before { "gap" } else { "fold" };
        let lo = before.to_datetime(t).min(after.to_datetime(t));
        let hi = before.to_datetime(t).max(after.to_datetime(t));
        let mid = lo.checked_add(hi.duration_since(lo) / 2).expect("civil");
        let mid = mid
            .with()
            .minute(mid.minute() / 15 * 15)
            .build()
            .expect("civil");
        let _ = writeln!(
            out,
            "\n{} at {} ({} -> {}): wall times [{}, {})",
            kind,
            t.strftime("%Y-%m-%dT%H:%M:%SZ"),
            before,
            after,
            lo.strftime("%Y-%m-%d %H:%M"),
            hi.strftime("%Y-%m-%d %H:%M"),
        );
        let policies = [
            ("default (gap=skip, fold=once)", DstPolicy::default()),
            (
                "gap=shift, fold=twice",
                DstPolicy {
                    gap: DstGap::Shift,
                    fold: DstFold::Twice,
                },
            ),
        ];
        for (label, dst) in policies {
            let half_hourly = Calendar::cron("*/30 * * * *", zone_name, dst).expect("valid");
            let _ = writeln!(out, "  */30 * * * *   {label}");
            let w0 = t.checked_sub(SignedDuration::from_hours(2)).expect("ts");
            let w1 = t.checked_add(SignedDuration::from_hours(3)).expect("ts");
            fires(&half_hourly, &zone, w0, w1, &mut out);
            let expr = format!("{} {} * * *", mid.minute(), mid.hour());
            let daily = Calendar::cron(&expr, zone_name, dst).expect("valid");
            let _ = writeln!(out, "  {expr:<14} {label}");
            let d0 = t.checked_sub(SignedDuration::from_hours(36)).expect("ts");
            let d1 = t.checked_add(SignedDuration::from_hours(36)).expect("ts");
            fires(&daily, &zone, d0, d1, &mut out);
        }
    }
    if !any {
        out.push_str("\nno transitions: every wall time exists exactly once\n");
        let daily = Calendar::cron("30 0 * * *", zone_name, DstPolicy::default()).expect("valid");
        out.push_str("  30 0 * * *\n");
        fires(
            &daily,
            &zone,
            ts(from),
            ts(from)
                .checked_add(SignedDuration::from_hours(72))
                .expect("ts"),
            &mut out,
        );
    }
    out
}

#[test]
fn new_york() {
    insta::assert_snapshot!(table(
        "America/New_York",
        "2026-01-01T00:00:00Z",
        "2027-01-01T00:00:00Z"
    ));
}

#[test]
fn paris() {
    insta::assert_snapshot!(table(
        "Europe/Paris",
        "2026-01-01T00:00:00Z",
        "2027-01-01T00:00:00Z"
    ));
}

#[test]
fn lord_howe_thirty_minute_shift() {
    insta::assert_snapshot!(table(
        "Australia/Lord_Howe",
        "2026-01-01T00:00:00Z",
        "2027-01-01T00:00:00Z"
    ));
}

#[test]
fn santiago_transition_at_midnight() {
    insta::assert_snapshot!(table(
        "America/Santiago",
        "2026-01-01T00:00:00Z",
        "2027-01-01T00:00:00Z"
    ));
}

#[test]
fn troll_two_hour_shift() {
    insta::assert_snapshot!(table(
        "Antarctica/Troll",
        "2026-01-01T00:00:00Z",
        "2027-01-01T00:00:00Z"
    ));
}

#[test]
fn dublin_negative_dst() {
    insta::assert_snapshot!(table(
        "Europe/Dublin",
        "2026-01-01T00:00:00Z",
        "2027-01-01T00:00:00Z"
    ));
}

#[test]
fn sao_paulo_last_dst_then_abolished() {
    // Brazil's last DST ended 2019-02-17; from then on there are no transitions.
    insta::assert_snapshot!(table(
        "America/Sao_Paulo",
        "2018-10-01T00:00:00Z",
        "2019-03-01T00:00:00Z"
    ));
    insta::assert_snapshot!(
        "sao_paulo_after_abolition",
        table(
            "America/Sao_Paulo",
            "2019-03-01T00:00:00Z",
            "2027-01-01T00:00:00Z"
        )
    );
}

#[test]
fn sydney_southern_hemisphere() {
    insta::assert_snapshot!(table(
        "Australia/Sydney",
        "2026-01-01T00:00:00Z",
        "2027-01-01T00:00:00Z"
    ));
}
