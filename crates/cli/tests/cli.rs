//! The `campanile` binary as a user runs it.

use std::process::{Command, Output};

fn campanile(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_campanile"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn preview_json_is_exactly_the_utc_instants() {
    let o = campanile(&[
        "preview",
        "--cron",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--after",
        "2026-03-07T00:00:00Z",
        "--count",
        "3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "[\"2026-03-07T07:30:00Z\",\"2026-03-09T06:30:00Z\",\"2026-03-10T06:30:00Z\"]\n"
    );
}

#[test]
fn preview_policies_change_the_answer() {
    let o = campanile(&[
        "preview",
        "--cron",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--after",
        "2026-03-07T00:00:00Z",
        "--count",
        "2",
        "--json",
        "--dst-gap",
        "shift",
    ]);
    assert_eq!(
        stdout(&o),
        "[\"2026-03-07T07:30:00Z\",\"2026-03-08T07:00:00Z\"]\n"
    );
    let o = campanile(&[
        "preview",
        "--cron",
        "30 1 * * *",
        "--tz",
        "America/New_York",
        "--after",
        "2026-11-01T00:00:00Z",
        "--count",
        "3",
        "--json",
        "--dst-fold",
        "twice",
    ]);
    assert_eq!(
        stdout(&o),
        "[\"2026-11-01T05:30:00Z\",\"2026-11-01T06:30:00Z\",\"2026-11-02T06:30:00Z\"]\n"
    );
}

#[test]
fn preview_table_marks_dst_decisions() {
    let o = campanile(&[
        "preview",
        "--cron",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--after",
        "2026-03-07T00:00:00Z",
        "--count",
        "3",
    ]);
    assert!(o.status.success());
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(lines[1].contains("2026-03-07 02:30:00 -05:00 EST"), "{out}");
    assert!(
        lines[2].contains("2026-03-09T06:30:00Z") && lines[2].contains("gap"),
        "{out}"
    );
    assert!(lines[2].contains("skip"), "{out}");
}

#[test]
fn bad_input_exits_2_with_one_line_on_stderr() {
    let cases: [&[&str]; 6] = [
        &["preview", "--cron", "0 25 * * *", "--tz", "UTC"],
        &["preview", "--cron", "0 0 30 2 *", "--tz", "UTC"],
        &["preview", "--cron", "0 0 * * *", "--tz", "Mars/Base"],
        &["preview", "--cron", "0 0 * * *", "--after", "yesterday"],
        &["preview", "--cron", "0 0 * * *", "--dst-gap", "maybe"],
        &["preview", "--cron", "0 0 * * *", "--count", "0"],
    ];
    for args in cases {
        let o = campanile(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{args:?}");
        assert!(!stderr(&o).trim().is_empty(), "{args:?}");
    }
    let o = campanile(&["preview", "--cron", "0 25 * * *"]);
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("hour") && err.contains("'25'"), "{err}");
}
