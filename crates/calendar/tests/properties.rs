//! Property tests over random expressions, zones and start instants.

use std::collections::BTreeSet;

use campanile_calendar::{Calendar, CronExpr, DstFold, DstGap, DstPolicy, Zone};
use jiff::tz::AmbiguousOffset;
use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

const ZONES: &[&str] = &[
    "UTC",
    "America/New_York",
    "Europe/Paris",
    "Europe/Dublin",
    "Australia/Lord_Howe",
    "Australia/Sydney",
    "America/Santiago",
    "Antarctica/Troll",
    "America/Sao_Paulo",
    "Asia/Kolkata",
    "Pacific/Chatham",
    "America/St_Johns",
];

fn field(choices: Vec<String>) -> impl Strategy<Value = String> {
    proptest::sample::select(choices)
}

fn minute() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("*".to_string()),
        (1u32..=30).prop_map(|s| format!("*/{s}")),
        (0u32..60).prop_map(|m| m.to_string()),
        (0u32..30, 30u32..60).prop_map(|(a, b)| format!("{a}-{b}")),
        (0u32..60, 0u32..60).prop_map(|(a, b)| format!("{a},{b}")),
        (0u32..20, 1u32..15).prop_map(|(a, s)| format!("{a}/{s}")),
    ]
}

fn hour() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("*".to_string()),
        (1u32..=6).prop_map(|s| format!("*/{s}")),
        (0u32..24).prop_map(|h| h.to_string()),
        (0u32..4).prop_map(|h| h.to_string()), // DST transitions live here
        (0u32..3, 1u32..4).prop_map(|(a, n)| format!("{a}-{}", a + n)),
        (0u32..24, 0u32..24).prop_map(|(a, b)| format!("{a},{b}")),
    ]
}

fn dom() -> impl Strategy<Value = String> {
    field(
        [
            "*", "?", "1", "15", "L", "15W", "LW", "1-10", "*/3", "28-31", "5,20",
        ]
        .map(String::from)
        .to_vec(),
    )
}

fn month() -> impl Strategy<Value = String> {
    field(
        ["*", "*", "*", "3", "10,11", "MAR-APR", "*/2", "SEP-DEC"]
            .map(String::from)
            .to_vec(),
    )
}

fn dow() -> impl Strategy<Value = String> {
    field(
        [
            "*", "*", "?", "0", "7", "MON-FRI", "5L", "SUN#1", "1#2", "SAT,SUN", "*/2",
        ]
        .map(String::from)
        .to_vec(),
    )
}

fn expression() -> impl Strategy<Value = String> {
    (minute(), hour(), dom(), month(), dow())
        .prop_map(|(mi, h, d, mo, w)| format!("{mi} {h} {d} {mo} {w}"))
        .prop_filter("must be able to fire", |e| CronExpr::parse(e).is_ok())
}

fn policy() -> impl Strategy<Value = DstPolicy> {
    (
        prop_oneof![Just(DstGap::Skip), Just(DstGap::Shift)],
        prop_oneof![Just(DstFold::Once), Just(DstFold::Twice)],
    )
        .prop_map(|(gap, fold)| DstPolicy { gap, fold })
}

/// A start instant: either anywhere in 2018-2032, or within a day and a half of one of the
/// zone's transitions in those years, where the DST rules matter.
fn start(zone: &'static str) -> impl Strategy<Value = Timestamp> {
    (
        any::<bool>(),
        0i64..(15 * 365 * 86_400),
        -129_600i64..129_600,
    )
        .prop_map(move |(near, base, jitter)| {
            let t0 = Timestamp::from_second(1_514_764_800 + base).expect("in range"); // 2018-01-01 + base
            if near {
                let tz = Zone::get(zone).expect("zone");
                if let Some(tr) = tz.tz().following(t0).next() {
                    return tr
                        .timestamp()
                        .checked_add(SignedDuration::from_secs(jitter))
                        .expect("in range");
                }
            }
            t0
        })
}

fn case() -> impl Strategy<Value = (String, &'static str, DstPolicy, Timestamp)> {
    (expression(), proptest::sample::select(ZONES), policy())
        .prop_flat_map(|(e, z, p)| (Just(e), Just(z), Just(p), start(z)))
}

/// What the contract says, computed the slow way: scan every minute of `[after, until)` and
/// decide each instant on its own (every `step`, 1 min or 1 s) from its wall time and jiff's gap/fold classification.
fn brute_force(
    expr: &CronExpr,
    zone: &Zone,
    dst: DstPolicy,
    after: Timestamp,
    until: Timestamp,
    step: SignedDuration,
) -> BTreeSet<Timestamp> {
    let tz = zone.tz();
    let mut out = BTreeSet::new();
    let step_s = step.as_secs();
    let mut m =
        Timestamp::from_second(after.as_second().div_euclid(step_s) * step_s).expect("in range");
    while m < until {
        if m > after {
            let wall = tz.to_datetime(m);
            if expr.matches(wall) {
                let later_fold = matches!(
                    tz.to_ambiguous_timestamp(wall).offset(),
                    AmbiguousOffset::Fold { before, .. } if before.to_timestamp(wall).ok() != Some(m)
                );
                if !later_fold || dst.fold == DstFold::Twice {
                    out.insert(m);
                }
            }
        }
        m = m.checked_add(step).expect("in range");
    }
    if dst.gap == DstGap::Shift {
        // Each gap that swallowed a matching wall time fires once, at its end.
        for tr in tz.following(
            after
                .checked_sub(SignedDuration::from_hours(24))
                .expect("in range"),
        ) {
            let t = tr.timestamp();
            if t >= until {
                break;
            }
            let before = tz.to_offset(
                t.checked_sub(SignedDuration::from_secs(1))
                    .expect("in range"),
            );
            if tr.offset() <= before || t <= after {
                continue;
            }
            let mut wall = before.to_datetime(t);
            let end = tr.offset().to_datetime(t);
            while wall < end {
                if expr.matches(wall) {
                    out.insert(t);
                    break;
                }
                wall = wall.checked_add(step).expect("in range");
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn next_after_agrees_with_brute_force((e, z, dst, after) in case()) {
        let expr = CronExpr::parse(&e).expect("filtered");
        let zone = Zone::get(z).expect("zone");
        let cal = Calendar::Cron { expr: expr.clone(), zone: zone.clone(), dst };
        let until = after.checked_add(SignedDuration::from_hours(72)).expect("in range");
        let want = brute_force(&expr, &zone, dst, after, until, SignedDuration::from_mins(1));
        let got: BTreeSet<Timestamp> = cal.iter_after(after).take_while(|t| *t < until).collect();
        prop_assert_eq!(got, want, "{} in {} with {:?} after {}", e, z, dst, after);
    }

    #[test]
    fn results_increase_match_and_never_repeat_a_wall_time((e, z, _dst, after) in case()) {
        let cal = Calendar::cron(&e, z, DstPolicy::default()).expect("valid");
        let Calendar::Cron { expr, zone, .. } = &cal else { unreachable!() };
        let mut prev = after;
        let mut walls = BTreeSet::new();
        for t in cal.iter_after(after).take(40) {
            prop_assert!(t > prev, "{} then {}", prev, t);
            let wall = zone.tz().to_datetime(t);
            prop_assert!(expr.matches(wall), "{} ({}) does not match {}", t, wall, e);
            prop_assert!(walls.insert(wall), "wall time {} fired twice for {}", wall, e);
            prev = t;
        }
    }

    #[test]
    fn six_field_expressions_agree_with_a_second_by_second_scan(sec in "(\\*/[1-9]|[0-5]?[0-9]|[0-9],[1-5][0-9])", (e, z, dst, after) in case()) {
        let six = format!("{sec} {e}");
        let expr = CronExpr::parse(&six).expect("valid");
        let zone = Zone::get(z).expect("zone");
        let cal = Calendar::Cron { expr: expr.clone(), zone: zone.clone(), dst };
        let until = after.checked_add(SignedDuration::from_hours(3)).expect("in range");
        let want = brute_force(&expr, &zone, dst, after, until, SignedDuration::from_secs(1));
        let got: BTreeSet<Timestamp> = cal.iter_after(after).take_while(|t| *t < until).collect();
        prop_assert_eq!(got, want, "{} in {} with {:?} after {}", six, z, dst, after);
    }
}

#[test]
fn the_issue_example() {
    let cal =
        Calendar::cron("30 2 * * *", "America/New_York", DstPolicy::default()).expect("valid");
    let after: Timestamp = "2026-03-07T00:00:00Z".parse().expect("ts");
    let got: Vec<String> = cal
        .iter_after(after)
        .take(3)
        .map(|t| t.to_string())
        .collect();
    assert_eq!(
        got,
        [
            "2026-03-07T07:30:00Z",
            "2026-03-09T06:30:00Z",
            "2026-03-10T06:30:00Z"
        ]
    );
}

#[test]
fn search_is_bounded_near_the_end_of_time() {
    let cal = Calendar::cron("0 0 29 2 *", "UTC", DstPolicy::default()).expect("valid");
    let late: Timestamp = "9999-03-01T00:00:00Z".parse().expect("ts");
    assert_eq!(cal.next_after(late), None);
    let every = Calendar::every(SignedDuration::from_hours(1), Timestamp::MIN).expect("valid");
    assert_eq!(every.next_after(Timestamp::MAX), None);
}
