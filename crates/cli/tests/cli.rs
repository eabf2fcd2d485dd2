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
    let cases: [&[&str]; 9] = [
        &["preview", "--cron", "0 25 * * *", "--tz", "UTC"],
        &["preview", "--cron", "0 0 30 2 *", "--tz", "UTC"],
        &["preview", "--cron", "0 0 * * *", "--tz", "Mars/Base"],
        &["preview", "--cron", "0 0 * * *", "--after", "yesterday"],
        &["preview", "--cron", "0 0 * * *", "--dst-gap", "maybe"],
        &["preview", "--cron", "0 0 * * *", "--count", "0"],
        // Checked before anything is connected to or created.
        &[
            "bench",
            "relay",
            "--nats-url",
            "nats://127.0.0.1:4222",
            "--occurrences",
            "0",
        ],
        // Not a NATS URL at all.
        &[
            "bench",
            "relay",
            "--nats-url",
            "nats://127.0.0.1:notaport",
            "--occurrences",
            "10",
        ],
        // Not a PostgreSQL URL either.
        &[
            "bench",
            "store",
            "--backend",
            "postgres",
            "--database",
            "postgres://127.0.0.1:notaport/test",
        ],
    ];
    for args in cases {
        let o = campanile(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{args:?}");
        assert!(!stderr(&o).trim().is_empty(), "{args:?}");
    }
    // Nothing listens on the discard port: an unreachable server is the environment, exit 1,
    // for NATS as for the database.
    let unreachable: [&[&str]; 2] = [
        &[
            "bench",
            "relay",
            "--nats-url",
            "nats://127.0.0.1:9",
            "--occurrences",
            "10",
        ],
        &[
            "bench",
            "store",
            "--backend",
            "postgres",
            "--database",
            "postgres://postgres@127.0.0.1:9/test",
        ],
    ];
    for args in unreachable {
        let o = campanile(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).trim().is_empty(), "{args:?}");
    }
    let o = campanile(&["preview", "--cron", "0 25 * * *"]);
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("hour") && err.contains("'25'"), "{err}");
}

#[test]
fn serve_reads_a_config_file_and_refuses_a_bad_one() {
    let dir = std::env::temp_dir().join(format!("campanile-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let cfg = dir.join("campanile.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase = \"{}\"\nshards = 4\n",
            dir.join("c.db").display()
        ),
    )
    .expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_campanile"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let start = std::time::Instant::now();
    let mut up = false;
    while start.elapsed() < std::time::Duration::from_secs(20) {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            up = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(up, "serve listens where the config file says");
    assert!(dir.join("c.db").exists(), "and uses its database");

    // The database now records 4 shards: a node started with another count would never plan
    // the schedules filed under the shards it does not know, so it refuses to start.
    let mut other = Command::new(env!("CARGO_BIN_EXE_campanile"))
        .args([
            "serve",
            "--shards",
            "16",
            "--listen",
            "127.0.0.1:0",
            "--database",
        ])
        .arg(dir.join("c.db"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = other.try_wait().expect("wait") {
            break Some(status);
        }
        if start.elapsed() > std::time::Duration::from_secs(20) {
            let _ = other.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut other.stderr.take().expect("stderr"), &mut err)
        .expect("read");
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(err.contains("--shards 4"), "{err}");

    std::fs::write(&cfg, "listen = \"not an address\"\n").expect("write");
    let o = campanile(&["serve", "--config", cfg.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("config file"), "{}", stderr(&o));
    std::fs::write(&cfg, "colour = \"red\"\n").expect("write");
    let o = campanile(&["serve", "--config", cfg.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tenant_and_key_admin() {
    let dir = std::env::temp_dir().join(format!("campanile-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("a.db");
    let db = db.to_str().expect("utf8");
    let o = campanile(&["tenant", "create", "acme", "--database", db]);
    assert!(o.status.success(), "{}", stderr(&o));
    let key = stdout(&o);
    assert_eq!(key.lines().count(), 1, "the key alone on stdout");
    assert!(
        key.trim().starts_with("cmp_") && key.trim().len() == 68,
        "{key}"
    );
    let o = campanile(&["tenant", "create", "acme", "--database", db]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "a duplicate name is a usage error: {}",
        stderr(&o)
    );
    let o = campanile(&["tenant", "create", "bad name!", "--database", db]);
    assert_eq!(o.status.code(), Some(2));
    let o = campanile(&["tenant", "list", "--database", db]);
    assert!(stdout(&o).starts_with("acme\t"));
    let o = campanile(&["key", "create", "--tenant", "acme", "--database", db]);
    assert!(o.status.success());
    let o = campanile(&["key", "create", "--tenant", "nobody", "--database", db]);
    assert_eq!(o.status.code(), Some(2));
    let o = campanile(&["key", "revoke", key.trim(), "--database", db]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = campanile(&["key", "revoke", key.trim(), "--database", db]);
    assert_eq!(o.status.code(), Some(2), "already revoked");
    let o = campanile(&[
        "tenant",
        "quota",
        "acme",
        "--max-running",
        "5",
        "--database",
        db,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A bare `quota NAME` would remove every limit: it takes an explicit --clear.
    let o = campanile(&["tenant", "quota", "acme", "--database", db]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--clear"), "{}", stderr(&o));
    let args = ["tenant", "quota", "acme", "--clear", "--max-running", "1"];
    let o = campanile(&[&args[..], &["--database", db]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = campanile(&["tenant", "quota", "acme", "--clear", "--database", db]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = campanile(&[
        "tenant",
        "queue-limit",
        "acme",
        "emails",
        "--max-running",
        "2",
        "--database",
        db,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A class labels the tenant's lag metrics; list shows it; a malformed one or an unknown
    // tenant is a usage error.
    let o = campanile(&["tenant", "class", "acme", "pro", "--database", db]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = campanile(&["tenant", "list", "--database", db]);
    assert!(stdout(&o).contains("\tpro\tdefault\t-\n"), "{}", stdout(&o));
    // A retention: days, forever, or back to the operator's default; list shows it.
    for (args, shown) in [
        (&["--days", "30"][..], "\t30d"),
        (&["--forever"][..], "\tforever"),
        (&["--default"][..], "\tdefault"),
    ] {
        let o = campanile(
            &[
                &["tenant", "retention", "acme"][..],
                args,
                &["--database", db],
            ]
            .concat(),
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let o = campanile(&["tenant", "list", "--database", db]);
        assert!(stdout(&o).contains(&format!("{shown}\t")), "{}", stdout(&o));
    }
    for bad in [
        &["--days", "0"][..],
        &[][..],
        &["--days", "3", "--forever"][..],
    ] {
        let o = campanile(
            &[
                &["tenant", "retention", "acme"][..],
                bad,
                &["--database", db],
            ]
            .concat(),
        );
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
    }
    let o = campanile(&[
        "tenant",
        "retention",
        "nobody",
        "--days",
        "3",
        "--database",
        db,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = campanile(&["tenant", "class", "acme", "Pro!", "--database", db]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("lower-case"), "{}", stderr(&o));
    let o = campanile(&["tenant", "class", "nobody", "pro", "--database", db]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `campanile` with `args`, killed if it has not exited within 60 s.
fn campanile_within_a_minute(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_campanile"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let start = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn database_passwords_are_never_shown() {
    // Nothing listens on port 1: every command fails to connect and says where it tried.
    let url = "postgres://user:pw@127.0.0.1:1/db?password=pw2";
    let commands: [&[&str]; 6] = [
        &["migrate", "--database", url],
        &["tenant", "list", "--database", url],
        &["tenant", "create", "acme", "--database", url],
        &["key", "create", "--admin", "--database", url],
        &["reconcile", "--tenant", "acme", "--database", url],
        &["serve", "--listen", "127.0.0.1:0", "--database", url],
    ];
    for args in commands {
        let o = campanile_within_a_minute(args);
        let (out, err) = (stdout(&o), stderr(&o));
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("127.0.0.1:1"), "{args:?}: {err}");
        for secret in ["pw2", "pw"] {
            assert!(
                !out.contains(secret) && !err.contains(secret),
                "{args:?} shows {secret}: {out}{err}"
            );
        }
    }
}

#[test]
fn zone_names_and_offsets_are_checked_on_the_command_line() {
    for (args, needle) in [
        (
            &["preview", "--cron", "0 1 * * *", "--tz", "localtime"][..],
            "localtime",
        ),
        (
            &["preview", "--cron", "0 1 * * *", "--tz", "Factory"],
            "Factory",
        ),
        (
            &["preview", "--cron", "0 1 * * *", "--tz", "/etc/localtime"],
            "/etc/localtime",
        ),
        (
            &[
                "preview",
                "--cron",
                "0 1 * * *",
                "--after",
                "2030-01-01T00:00:00+25:00",
            ],
            "23:59",
        ),
        (
            &[
                "reconcile",
                "--tenant",
                "acme",
                "--from",
                "2030-01-01T00:00:00+25:00",
            ],
            "23:59",
        ),
    ] {
        let o = campanile(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
    let o = campanile(&[
        "preview",
        "--cron",
        "0 1 * * *",
        "--tz",
        "utc",
        "--count",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("UTC"), "{}", stdout(&o));
}
