//! Grammar tests: every construct, and every error path.

use jiff::Timestamp;

use crate::{Calendar, CalendarError, DstPolicy, Field};

fn fires(expr: &str, after: &str, n: usize) -> Vec<String> {
    let cal =
        Calendar::cron(expr, "UTC", DstPolicy::default()).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let after: Timestamp = after.parse().expect("valid instant");
    cal.iter_after(after)
        .take(n)
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S %a").to_string())
        .collect()
}

fn err(expr: &str) -> CalendarError {
    match super::CronExpr::parse(expr) {
        Ok(_) => panic!("'{expr}' should have been refused"),
        Err(e) => e,
    }
}

fn token_err(expr: &str) -> (Field, String, String) {
    match err(expr) {
        CalendarError::InvalidToken {
            field,
            token,
            reason,
        } => (field, token, reason),
        other => panic!("'{expr}': expected InvalidToken, got {other:?}"),
    }
}

#[test]
fn steps_ranges_and_lists() {
    assert_eq!(
        fires("*/15 * * * *", "2026-01-01T00:00:00Z", 4),
        [
            "2026-01-01 00:15:00 Thu",
            "2026-01-01 00:30:00 Thu",
            "2026-01-01 00:45:00 Thu",
            "2026-01-01 01:00:00 Thu"
        ]
    );
    assert_eq!(
        fires("10-20/5 * * * *", "2026-01-01T00:00:00Z", 4),
        [
            "2026-01-01 00:10:00 Thu",
            "2026-01-01 00:15:00 Thu",
            "2026-01-01 00:20:00 Thu",
            "2026-01-01 01:10:00 Thu"
        ]
    );
    assert_eq!(
        fires("5/20 * * * *", "2026-01-01T00:00:00Z", 4),
        [
            "2026-01-01 00:05:00 Thu",
            "2026-01-01 00:25:00 Thu",
            "2026-01-01 00:45:00 Thu",
            "2026-01-01 01:05:00 Thu"
        ]
    );
    assert_eq!(
        fires("0 1,2,3 * * *", "2026-01-01T02:00:00Z", 2),
        ["2026-01-01 03:00:00 Thu", "2026-01-02 01:00:00 Fri"]
    );
    assert_eq!(
        fires("0 9-11 * * *", "2026-01-01T11:00:00Z", 1),
        ["2026-01-02 09:00:00 Fri"]
    );
}

#[test]
fn six_fields_put_seconds_first() {
    assert_eq!(
        fires("*/20 * * * * *", "2026-01-01T00:00:00Z", 3),
        [
            "2026-01-01 00:00:20 Thu",
            "2026-01-01 00:00:40 Thu",
            "2026-01-01 00:01:00 Thu"
        ]
    );
    assert_eq!(
        fires("30 0 12 * * *", "2026-01-01T12:00:30Z", 1),
        ["2026-01-02 12:00:30 Fri"]
    );
}

#[test]
fn step_counts_from_the_range_start_and_restarts_each_period() {
    // */2 in day-of-month is 1,3,...,31: it fires on the 31st and again on the 1st.
    assert_eq!(
        fires("0 0 */2 * *", "2026-01-29T00:00:00Z", 3),
        [
            "2026-01-31 00:00:00 Sat",
            "2026-02-01 00:00:00 Sun",
            "2026-02-03 00:00:00 Tue"
        ]
    );
    // */5 hours: 0,5,10,15,20 then 0 — four hours from 20:00 to 00:00.
    assert_eq!(
        fires("0 */5 * * *", "2026-01-01T20:00:00Z", 1),
        ["2026-01-02 00:00:00 Fri"]
    );
}

#[test]
fn names_are_case_insensitive_and_weekday_seven_is_sunday() {
    assert_eq!(
        fires("0 0 1 jan,Mar *", "2026-01-02T00:00:00Z", 2),
        ["2026-03-01 00:00:00 Sun", "2027-01-01 00:00:00 Fri"]
    );
    assert_eq!(
        fires("0 0 * * 0", "2026-01-01T00:00:00Z", 3),
        fires("0 0 * * 7", "2026-01-01T00:00:00Z", 3)
    );
    assert_eq!(
        fires("0 0 * * SUN", "2026-01-01T00:00:00Z", 3),
        fires("0 0 * * 7", "2026-01-01T00:00:00Z", 3)
    );
    assert_eq!(
        fires("0 0 * * MON-FRI", "2026-01-02T00:00:00Z", 2),
        ["2026-01-05 00:00:00 Mon", "2026-01-06 00:00:00 Tue"]
    );
    assert_eq!(
        fires("0 0 * * 5-7", "2026-01-01T00:00:00Z", 3),
        [
            "2026-01-02 00:00:00 Fri",
            "2026-01-03 00:00:00 Sat",
            "2026-01-04 00:00:00 Sun"
        ]
    );
}

#[test]
fn last_nearest_and_nth_modifiers() {
    // L: last day of the month, leap years included.
    assert_eq!(
        fires("0 0 L * *", "2028-01-31T00:00:00Z", 2),
        ["2028-02-29 00:00:00 Tue", "2028-03-31 00:00:00 Fri"]
    );
    // 5L and FRIL: the last Friday.
    assert_eq!(
        fires("0 0 * * 5L", "2026-01-01T00:00:00Z", 2),
        ["2026-01-30 00:00:00 Fri", "2026-02-27 00:00:00 Fri"]
    );
    assert_eq!(
        fires("0 0 * * FRIL", "2026-01-01T00:00:00Z", 2),
        fires("0 0 * * 5L", "2026-01-01T00:00:00Z", 2)
    );
    // 1#2: the second Monday.
    assert_eq!(
        fires("0 0 * * 1#2", "2026-01-01T00:00:00Z", 2),
        ["2026-01-12 00:00:00 Mon", "2026-02-09 00:00:00 Mon"]
    );
    assert_eq!(
        fires("0 0 * * MON#1", "2026-01-01T00:00:00Z", 1),
        ["2026-01-05 00:00:00 Mon"]
    );
    // 15W: 2026-08-15 is a Saturday, so Friday the 14th; 2026-11-15 is a Sunday, so Monday 16th.
    assert_eq!(
        fires("0 0 15W 8 *", "2026-01-01T00:00:00Z", 1),
        ["2026-08-14 00:00:00 Fri"]
    );
    assert_eq!(
        fires("0 0 15W 11 *", "2026-01-01T00:00:00Z", 1),
        ["2026-11-16 00:00:00 Mon"]
    );
    // 1W never leaves the month: 2026-08-01 is a Saturday, so Monday the 3rd.
    assert_eq!(
        fires("0 0 1W 8 *", "2026-01-01T00:00:00Z", 1),
        ["2026-08-03 00:00:00 Mon"]
    );
    // LW: the last weekday; 2026-05-31 is a Sunday.
    assert_eq!(
        fires("0 0 LW 5 *", "2026-01-01T00:00:00Z", 1),
        ["2026-05-29 00:00:00 Fri"]
    );
}

#[test]
fn question_mark_is_a_wildcard_in_day_fields() {
    assert_eq!(
        fires("0 0 ? * MON", "2026-01-01T00:00:00Z", 2),
        fires("0 0 * * MON", "2026-01-01T00:00:00Z", 2)
    );
    assert_eq!(
        fires("0 0 1 * ?", "2026-01-01T00:00:00Z", 2),
        fires("0 0 1 * *", "2026-01-01T00:00:00Z", 2)
    );
}

#[test]
fn day_of_month_and_day_of_week_or_when_both_restricted() {
    // The 13th OR any Friday (POSIX/Vixie), not "Friday the 13th".
    assert_eq!(
        fires("0 0 13 * 5", "2026-01-01T00:00:00Z", 4),
        [
            "2026-01-02 00:00:00 Fri",
            "2026-01-09 00:00:00 Fri",
            "2026-01-13 00:00:00 Tue",
            "2026-01-16 00:00:00 Fri"
        ]
    );
    // A stepped wildcard is a restriction too: odd days OR Mondays.
    assert_eq!(
        fires("0 0 */2 * 1", "2026-01-01T00:00:00Z", 4),
        [
            "2026-01-03 00:00:00 Sat",
            "2026-01-05 00:00:00 Mon",
            "2026-01-07 00:00:00 Wed",
            "2026-01-09 00:00:00 Fri"
        ]
    );
    // Only one restricted: that one decides.
    assert_eq!(
        fires("0 0 * * 5", "2026-01-01T00:00:00Z", 1),
        ["2026-01-02 00:00:00 Fri"]
    );
}

#[test]
fn macros() {
    let after = "2026-05-17T13:14:15Z";
    assert_eq!(fires("@yearly", after, 1), ["2027-01-01 00:00:00 Fri"]);
    assert_eq!(fires("@annually", after, 1), fires("@yearly", after, 1));
    assert_eq!(fires("@monthly", after, 1), ["2026-06-01 00:00:00 Mon"]);
    assert_eq!(fires("@weekly", after, 1), ["2026-05-24 00:00:00 Sun"]);
    assert_eq!(fires("@daily", after, 1), ["2026-05-18 00:00:00 Mon"]);
    assert_eq!(fires("@midnight", after, 1), fires("@daily", after, 1));
    assert_eq!(fires("@HOURLY", after, 1), ["2026-05-17 14:00:00 Sun"]);
}

#[test]
fn rare_but_possible_expressions_are_found_without_looping() {
    // Feb 29 on a Monday... with the OR rule that is any Monday in February or Feb 29.
    assert_eq!(
        fires("0 0 29 2 *", "2097-03-01T00:00:00Z", 1),
        ["2104-02-29 00:00:00 Fri"]
    );
    // Fifth Friday of February: only leap years whose Feb 1 is a Friday.
    assert_eq!(
        fires("0 0 * 2 5#5", "2026-01-01T00:00:00Z", 1),
        ["2036-02-29 00:00:00 Fri"]
    );
}

#[test]
fn shape_errors() {
    assert_eq!(err(""), CalendarError::Empty);
    assert_eq!(err("   "), CalendarError::Empty);
    assert_eq!(err("* * * *"), CalendarError::FieldCount { found: 4 });
    assert_eq!(err("* * * * * * *"), CalendarError::FieldCount { found: 7 });
    assert_eq!(
        err("@fortnightly"),
        CalendarError::UnknownMacro("@fortnightly".into())
    );
    assert!(err("* * * * *x").to_string().contains("day-of-week"));
}

#[test]
fn out_of_range_values_name_their_field_and_token() {
    let cases = [
        ("60 * * * * *", Field::Second, "60"),
        ("60 * * * *", Field::Minute, "60"),
        ("0 24 * * *", Field::Hour, "24"),
        ("0 0 0 * *", Field::DayOfMonth, "0"),
        ("0 0 1,32 * *", Field::DayOfMonth, "32"),
        ("0 0 * 13 *", Field::Month, "13"),
        ("0 0 * 0 *", Field::Month, "0"),
        ("0 0 * * 8", Field::DayOfWeek, "8"),
        ("0 0 * * 1-9", Field::DayOfWeek, "1-9"),
        ("0 0-30 * * *", Field::Hour, "0-30"),
    ];
    for (expr, field, token) in cases {
        let (f, t, reason) = token_err(expr);
        assert_eq!((f, t.as_str()), (field, token), "{expr}: {reason}");
        let msg = err(expr).to_string();
        assert!(
            msg.contains(&field.to_string()) && msg.contains(&format!("'{token}'")),
            "{msg}"
        );
    }
}

#[test]
fn malformed_tokens_name_their_field_and_token() {
    let cases = [
        ("*/0 * * * *", Field::Minute, "*/0"),
        ("5-1 * * * *", Field::Minute, "5-1"),
        ("1,,2 * * * *", Field::Minute, ""),
        ("1-2-3 * * * *", Field::Minute, "1-2-3"),
        ("*/x * * * *", Field::Minute, "*/x"),
        ("0 0 * FOO *", Field::Month, "FOO"),
        ("0 0 * * FOO", Field::DayOfWeek, "FOO"),
        ("0 0 * * JAN", Field::DayOfWeek, "JAN"),
        ("0 0 * MON *", Field::Month, "MON"),
        ("? * * * *", Field::Minute, "?"),
        ("0 0 1,? * *", Field::DayOfMonth, "?"),
        ("0 0 * * L", Field::DayOfWeek, "L"),
        ("0 5W * * *", Field::Hour, "5W"),
        ("0 0 1#2 * *", Field::DayOfMonth, "1#2"),
        ("0 0 * * 1#6", Field::DayOfWeek, "1#6"),
        ("0 0 * * +1", Field::DayOfWeek, "+1"),
        ("0 0 % * *", Field::DayOfMonth, "%"),
        ("0 0 32W * *", Field::DayOfMonth, "32W"),
    ];
    for (expr, field, token) in cases {
        let (f, t, reason) = token_err(expr);
        assert_eq!((f, t.as_str()), (field, token), "{expr}: {reason}");
        assert!(!reason.is_empty());
    }
}

#[test]
fn expressions_that_can_never_fire_are_refused() {
    for expr in [
        "0 0 30 2 *",
        "0 0 31 4,6,9,11 *",
        "0 0 31 2 ?",
        "0 0 30,31 2 *",
    ] {
        assert_eq!(err(expr), CalendarError::NeverFires(expr.into()), "{expr}");
        assert!(err(expr).to_string().contains("never fire"));
    }
    // February 29th is rare, not impossible.
    assert!(super::CronExpr::parse("0 0 29 2 *").is_ok());
}

#[test]
fn zones_and_intervals_are_validated() {
    let e = Calendar::cron("0 0 * * *", "Mars/Olympus_Mons", DstPolicy::default()).unwrap_err();
    assert_eq!(e, CalendarError::UnknownZone("Mars/Olympus_Mons".into()));
    assert!(Calendar::cron("0 0 * * *", "", DstPolicy::default()).is_err());
    assert!(Calendar::cron("0 0 * * *", "Europe/Paris", DstPolicy::default()).is_ok());
    assert!(Calendar::every(jiff::SignedDuration::ZERO, Timestamp::UNIX_EPOCH).is_err());
    assert!(Calendar::every(jiff::SignedDuration::from_secs(-1), Timestamp::UNIX_EPOCH).is_err());
}

#[test]
fn once_and_every() {
    let at: Timestamp = "2026-06-01T12:00:00Z".parse().expect("instant");
    let once = Calendar::once(at);
    assert_eq!(
        once.next_after(
            at.checked_sub(jiff::SignedDuration::from_millis(1))
                .expect("ts")
        ),
        Some(at)
    );
    assert_eq!(once.next_after(at), None, "strictly after");

    let every = Calendar::every(jiff::SignedDuration::from_mins(90), at).expect("valid");
    let got: Vec<String> = every
        .iter_after("2026-06-01T00:00:00Z".parse().expect("ts"))
        .take(3)
        .map(|t| t.to_string())
        .collect();
    assert_eq!(
        got,
        [
            "2026-06-01T12:00:00Z",
            "2026-06-01T13:30:00Z",
            "2026-06-01T15:00:00Z"
        ]
    );
    assert_eq!(
        every.next_after(at).map(|t| t.to_string()),
        Some("2026-06-01T13:30:00Z".into())
    );
    let mid: Timestamp = "2026-06-01T13:29:59.999Z".parse().expect("ts");
    assert_eq!(
        every.next_after(mid).map(|t| t.to_string()),
        Some("2026-06-01T13:30:00Z".into())
    );
}

#[test]
fn intervals_ignore_dst() {
    // Hourly from midnight New York time on the spring-forward day: 23 fires that day.
    let anchor: Timestamp = "2026-03-08T05:00:00Z".parse().expect("ts"); // 00:00 EST
    let every = Calendar::every(jiff::SignedDuration::from_hours(1), anchor).expect("valid");
    let end: Timestamp = "2026-03-09T04:00:00Z".parse().expect("ts"); // 00:00 EDT next day
    let before = anchor
        .checked_sub(jiff::SignedDuration::from_secs(1))
        .expect("ts");
    assert_eq!(
        every.iter_after(before).take_while(|t| *t < end).count(),
        23
    );
}

#[test]
fn sub_second_starts_are_strictly_after() {
    let got = fires("0 0 * * *", "2026-01-01T00:00:00.001Z", 1);
    assert_eq!(got, ["2026-01-02 00:00:00 Fri"]);
    let got = fires("0 0 * * *", "2025-12-31T23:59:59.999Z", 1);
    assert_eq!(got, ["2026-01-01 00:00:00 Thu"]);
}
