//! How schedules, occurrences and the answers about them read on a terminal. Each takes the
//! parsed answer and its text (payloads and results are shown exactly as the node sent them).

use serde_json::Value;

use super::table::{block, cell, items, raw_field, table, text};

/// Headers of a schedule list.
pub(crate) const SCHEDULE_HEADERS: [&str; 6] =
    ["id", "state", "version", "queue", "timing", "next fire"];

/// One schedule as a row under [`SCHEDULE_HEADERS`].
pub(crate) fn schedule_row(s: &Value) -> Vec<String> {
    vec![
        cell(s, "id"),
        cell(s, "state"),
        cell(s, "version"),
        cell(s, "queue"),
        timing(s),
        items(s, "next_fires").first().map_or("-".into(), text),
    ]
}

/// A schedule's timing in a few words: `cron '0 2 * * *' Europe/Paris (dst gap skip, fold
/// once)`, `every PT10S from <anchor>`, `at <instant>`.
pub(crate) fn timing(s: &Value) -> String {
    if let Some(expr) = s.get("cron").and_then(Value::as_str) {
        let dst = s.get("dst").unwrap_or(&Value::Null);
        format!(
            "cron '{expr}' {} (dst gap {}, fold {})",
            cell(s, "timezone"),
            cell(dst, "gap"),
            cell(dst, "fold")
        )
    } else if let Some(every) = s.get("every").and_then(Value::as_str) {
        format!("every {every} from {}", cell(s, "anchor"))
    } else if let Some(at) = s.get("at").and_then(Value::as_str) {
        format!("at {at}")
    } else {
        "-".into()
    }
}

/// Instants one per line, or `none`.
fn instants(list: &[Value]) -> String {
    if list.is_empty() {
        "none".into()
    } else {
        list.iter().map(text).collect::<Vec<_>>().join("\n")
    }
}

/// The fields of one schedule (`path`: where it sits in the answer's text).
fn schedule_pairs(s: &Value, raw: &str, path: &[&str]) -> Vec<(&'static str, String)> {
    let at = |field: &'static str| {
        let mut p = path.to_vec();
        p.push(field);
        raw_field(raw, &p)
    };
    let misfire = s.get("misfire").unwrap_or(&Value::Null);
    let retry = s.get("retry").unwrap_or(&Value::Null);
    let mut misfire_text = format!(
        "{}, late after {} s",
        cell(misfire, "policy"),
        cell(misfire, "max_lateness_seconds")
    );
    if misfire.get("catchup_max").is_some_and(|m| !m.is_null()) {
        misfire_text.push_str(&format!(
            ", at most {} run {} ms apart",
            cell(misfire, "catchup_max"),
            cell(misfire, "catchup_interval_ms")
        ));
    }
    let mut pairs = vec![
        ("id", cell(s, "id")),
        ("version", cell(s, "version")),
        ("state", cell(s, "state")),
        ("queue", cell(s, "queue")),
    ];
    if let Some(t) = s.get("target").filter(|t| !t.is_null()) {
        pairs.push((
            "target",
            format!("{} {}", cell(t, "type"), cell(t, "subject")),
        ));
    }
    pairs.extend([
        ("timing", timing(s)),
        ("payload", at("payload")),
        ("priority", cell(s, "priority")),
        ("lease", format!("{} s", cell(s, "lease_seconds"))),
        ("overlap", cell(s, "overlap")),
        ("misfire", misfire_text),
        (
            "retry",
            format!(
                "{} attempts, backoff {}-{} ms",
                cell(retry, "max_attempts"),
                cell(retry, "backoff_initial_ms"),
                cell(retry, "backoff_max_ms")
            ),
        ),
        (
            "flex window",
            format!("{} s", cell(s, "flex_window_seconds")),
        ),
        ("created", cell(s, "created_at")),
        ("updated", cell(s, "updated_at")),
        ("next fires", instants(items(s, "next_fires"))),
    ]);
    pairs
}

/// One schedule (`GET /v1/schedules/{id}`, a create's answer).
pub(crate) fn schedule(s: &Value, raw: &str) -> String {
    block(&schedule_pairs(s, raw, &[]))
}

/// The answer to a pause, resume or cancel: the schedule after it, what of older versions
/// became `CANCELED`, and what runs on under its worker.
pub(crate) fn change(c: &Value, raw: &str) -> String {
    let s = c.get("schedule").unwrap_or(&Value::Null);
    let mut pairs = schedule_pairs(s, raw, &["schedule"]);
    let in_flight: Vec<String> = items(c, "in_flight")
        .iter()
        .map(|o| format!("{} {}", cell(o, "id"), cell(o, "state")))
        .collect();
    pairs.push(("canceled", cell(c, "canceled")));
    pairs.push((
        "in flight",
        if in_flight.is_empty() {
            "none".into()
        } else {
            in_flight.join("\n")
        },
    ));
    block(&pairs)
}

/// Headers of an occurrence list.
pub(crate) const OCCURRENCE_HEADERS: [&str; 7] = [
    "id",
    "schedule",
    "version",
    "scheduled for",
    "state",
    "attempts",
    "origin",
];

/// One occurrence as a row under [`OCCURRENCE_HEADERS`].
pub(crate) fn occurrence_row(o: &Value) -> Vec<String> {
    vec![
        cell(o, "id"),
        cell(o, "schedule_id"),
        cell(o, "version"),
        cell(o, "scheduled_for"),
        cell(o, "state"),
        format!("{}/{}", cell(o, "attempt_count"), cell(o, "max_attempts")),
        cell(o, "origin"),
    ]
}

/// One occurrence with its attempts (`GET /v1/occurrences/{id}`, a trigger's answer).
pub(crate) fn occurrence(o: &Value, raw: &str) -> String {
    // A run's own payload (a trigger's), as sent; none for every other run.
    let own = if o.get("payload").is_some() {
        raw_field(raw, &["payload"])
    } else {
        "(its version's)".into()
    };
    let mut out = block(&[
        ("id", cell(o, "id")),
        ("schedule", cell(o, "schedule_id")),
        ("version", cell(o, "version")),
        ("scheduled for", cell(o, "scheduled_for")),
        ("available at", cell(o, "available_at")),
        ("state", cell(o, "state")),
        ("origin", cell(o, "origin")),
        ("payload", own),
        (
            "attempts",
            format!(
                "{} of {}",
                cell(o, "attempt_count"),
                cell(o, "max_attempts")
            ),
        ),
        ("epoch", cell(o, "epoch")),
        ("owner", cell(o, "owner")),
        ("lease until", cell(o, "lease_until")),
        ("cancel requested", cell(o, "cancel_requested")),
        ("result", raw_field(raw, &["result"])),
        ("last error", cell(o, "last_error")),
        ("finished", cell(o, "finished_at")),
    ]);
    let attempts = items(o, "attempts");
    if !attempts.is_empty() {
        let rows: Vec<Vec<String>> = attempts
            .iter()
            .map(|a| {
                let error = match (a.get("error_class"), a.get("error_message")) {
                    (Some(Value::String(c)), Some(Value::String(m))) => format!("{c}: {m}"),
                    (Some(Value::String(c)), _) => c.clone(),
                    _ => "-".into(),
                };
                vec![
                    cell(a, "epoch"),
                    cell(a, "worker_id"),
                    cell(a, "started_at"),
                    cell(a, "finished_at"),
                    cell(a, "outcome"),
                    error,
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(
            &["epoch", "worker", "started", "finished", "outcome", "error"],
            &rows,
        ));
    }
    out
}

/// The answer to a redrive or a cancel of one occurrence.
pub(crate) fn ack(a: &Value) -> String {
    let mut pairs = vec![
        ("occurrence", cell(a, "occurrence_id")),
        ("outcome", cell(a, "outcome")),
        ("state", cell(a, "state")),
    ];
    if a.get("retry_at").is_some_and(|r| !r.is_null()) {
        pairs.push(("retry at", cell(a, "retry_at")));
    }
    if a.get("check").is_some_and(|r| !r.is_null()) {
        pairs.push(("check", cell(a, "check")));
        pairs.push(("message", cell(a, "message")));
    }
    block(&pairs)
}

/// A list page's closing lines: how to ask for the next page, and whether the node cut this
/// one short at its answer-size bound.
pub(crate) fn page_end(page: &Value) -> String {
    let mut out = String::new();
    if page.get("truncated").and_then(Value::as_bool) == Some(true) {
        out.push_str("(page cut short at the node's answer-size bound)\n");
    }
    if let Some(c) = page.get("next_cursor").and_then(Value::as_str) {
        out.push_str(&format!("next page: --cursor {c}\n"));
    }
    out
}

/// The answer of `POST /v1/schedules/preview`: as `campanile preview` prints its table.
pub(crate) fn preview(p: &Value) -> String {
    let fires = items(p, "fires");
    if fires.is_empty() {
        return "(no fire times)\n".into();
    }
    let rows: Vec<Vec<String>> = fires
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let wall = cell(f, "dst_wall_time");
            let note = match f.get("dst").and_then(Value::as_str) {
                Some("after_skipped_gap") => {
                    format!("after DST gap: {wall} did not exist, skipped")
                }
                Some("shifted_from_gap") => {
                    format!("DST gap: {wall} did not exist, fired at end of gap")
                }
                Some("fold_earlier") => "DST fold: first of the wall time's two instants".into(),
                Some("fold_later") => "DST fold: second of the wall time's two instants".into(),
                Some(other) => format!("DST: {other}"),
                None => String::new(),
            };
            vec![(i + 1).to_string(), cell(f, "at"), cell(f, "local"), note]
        })
        .collect();
    let local = format!("local ({})", cell(p, "timezone"));
    table(&["#", "UTC", &local, "note"], &rows)
}

/// The answer of `POST /v1/schedules/{id}/backfill`: what it made and what was there, then
/// each occurrence.
pub(crate) fn backfill(b: &Value) -> String {
    let created = items(b, "created");
    let rerun = items(b, "rerun");
    let existing = items(b, "existing");
    let mut out = block(&[
        ("backfill", cell(b, "backfill_id")),
        ("schedule", cell(b, "schedule_id")),
        ("version", cell(b, "version")),
        ("range", format!("{} to {}", cell(b, "from"), cell(b, "to"))),
        ("instants", cell(b, "instants")),
        ("created", created.len().to_string()),
        ("rerun", rerun.len().to_string()),
        ("existing", existing.len().to_string()),
        (
            "replayed",
            if b.get("replayed").and_then(Value::as_bool) == Some(true) {
                "yes (the answer to an earlier request with this Idempotency-Key)".into()
            } else {
                "no".into()
            },
        ),
    ]);
    let rows: Vec<Vec<String>> = created
        .iter()
        .map(|o| (o, "created"))
        .chain(rerun.iter().map(|o| (o, "rerun")))
        .chain(existing.iter().map(|o| (o, "existing")))
        .map(|(o, what)| {
            vec![
                cell(o, "id"),
                cell(o, "scheduled_for"),
                cell(o, "available_at"),
                cell(o, "state"),
                cell(o, "origin"),
                what.to_string(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &[
                "id",
                "scheduled for",
                "available at",
                "state",
                "origin",
                "backfill",
            ],
            &rows,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_backfill_answer_reads_as_counts_then_rows() {
        let answer = json!({
            "backfill_id": "b", "schedule_id": "s", "version": 2,
            "from": "2026-01-01T00:00:00Z", "to": "2026-01-01T03:00:00Z", "instants": 3,
            "created": [{"id": "o1", "scheduled_for": "2026-01-01T00:00:00Z",
                         "available_at": "2026-01-01T00:00:00Z", "state": "READY",
                         "origin": "backfill"}],
            "existing": [{"id": "o2", "scheduled_for": "2026-01-01T01:00:00Z",
                          "available_at": "2026-01-01T01:00:00Z", "state": "SUCCEEDED",
                          "origin": "planned"}],
            "replayed": false
        });
        let out = backfill(&answer);
        assert!(
            out.starts_with("backfill  b\nschedule  s\nversion   2\n"),
            "{out}"
        );
        assert!(
            out.contains("\ncreated   1\nrerun     0\nexisting  1\nreplayed  no\n"),
            "{out}"
        );
        let rows: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("id ")).collect();
        assert_eq!(rows.len(), 3, "{out}");
        assert!(rows[1].starts_with("o1  2026-01-01T00:00:00Z") && rows[1].ends_with("created"));
        assert!(rows[2].contains("SUCCEEDED") && rows[2].ends_with("existing"));
    }

    #[test]
    fn preview_notes_name_the_dst_decision() {
        let answer = json!({"timezone": "America/New_York", "next_fires": [], "fires": [
            {"at": "2026-03-08T07:00:00Z", "local": "2026-03-08T03:00:00-04:00",
             "dst": "after_skipped_gap", "dst_wall_time": "2026-03-08T02:30:00"}]});
        let out = preview(&answer);
        assert!(out.starts_with("#  UTC"), "{out}");
        assert!(out.contains("local (America/New_York)"), "{out}");
        assert!(
            out.contains("after DST gap: 2026-03-08T02:30:00 did not exist, skipped"),
            "{out}"
        );
    }
}
